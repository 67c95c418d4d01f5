/**
 * The intent ledger: every write the client makes to its intent store, and the checks made before
 * an intent's key may be sent (same request, key not expired on the server, outcome not uncertain).
 *
 * Writes happen at fixed points of a call, each awaited before the attempt it guards:
 * - before the first attempt: the request is recorded with the intent and that attempt counted
 *   (one write, so the success path costs no more than it did before attempts were counted);
 * - before every later attempt: the attempt is counted (so a process killed mid-attempt never
 *   leaves `attempts` at 0);
 * - when the call ends: done (a named intent is kept, an unnamed one deleted), given up (stays
 *   pending, with what the server last said), or uncertain.
 */
import { expiresAt } from "./answer.ts";
import { sameBody, storeBody } from "./body.ts";
import type { Call } from "./call.ts";
import { IntentConflictError, IntentExpiredError, OperationUncertainError } from "./errors.ts";
import {
  assertIntentId,
  type IntentAnswer,
  type IntentRecord,
  type IntentRef,
  IntentStatus,
  type IntentStore,
  isoNow,
  newIntentRecord,
  type StoredRequest,
} from "./intent-store.ts";
import { OPERATION_REF_HEADER } from "./operations.ts";

/** Headers never stored with an intent (besides the key header). */
const NOT_STORED = new Set(["authorization", "cookie", "proxy-authorization"]);

export class IntentLedger {
  readonly store: IntentStore;
  readonly #keyHeader: string;
  readonly #retentionMs: number;
  /**
   * Origins whose answers carried `Idempotency-Operation-Ref`: servers that offer the operation
   * lookup, asked before an intent's request is sent again (`client.resume`).
   */
  readonly advertised = new Set<string>();
  /** Where a stored uncertain intent's operation is looked up (OperationUncertainError.lookupUrl). */
  lookupUrl: ((record: IntentRecord) => string | undefined) | undefined;

  constructor(store: IntentStore, keyHeader: string, retentionMs: number) {
    this.store = store;
    this.#keyHeader = keyHeader;
    this.#retentionMs = retentionMs;
  }

  /** The stored intent with this id, or a new one with it (and a new key, or `key`). */
  async begin(id?: string, key?: string): Promise<IntentRecord> {
    if (id !== undefined) assertIntentId(id);
    const fresh = newIntentRecord(id);
    if (key !== undefined) {
      assertIntentId(key);
      fresh.key = key;
      if (id === undefined) fresh.id = key;
    }
    return this.store.create(fresh);
  }

  /** The stored intent a ref names, creating it when it is not stored yet. */
  async load(intent: IntentRef): Promise<IntentRecord> {
    if (typeof intent === "string") return (await this.store.get(intent)) ?? this.begin(intent);
    return (await this.store.get(intent.id)) ?? this.store.create(intent);
  }

  /**
   * Bind `call` to `record` and count its first attempt, in one write. A record that already holds
   * a request must hold this one (else {@link IntentConflictError}), must not be uncertain, and its
   * key must not have expired on the server. Throws synchronously; the write is for the caller to
   * await before sending.
   */
  bind(record: IntentRecord, call: Call, isNew: boolean): Promise<unknown> {
    const request = this.#requestOf(call);
    call.attach(record);
    if (record.request) {
      const prev = record.request;
      const what =
        prev.method !== request.method
          ? "method"
          : prev.url !== request.url
            ? "URL"
            : sameBody(prev.body, request.body)
              ? undefined
              : "body";
      if (what) throw new IntentConflictError(record.id, what);
      return this.reopen(record, call);
    }
    // Recorded BEFORE the first attempt can have any effect, so a crash cannot lose the key.
    record.request = request;
    record.attempts++;
    call.counted = 1;
    if (isNew) return this.store.create(record);
    record.updatedAt = isoNow();
    return this.store.save(record);
  }

  /**
   * A recorded intent is sent again (resume, or the same request repeated): check it may be, count
   * the first attempt, and write that.
   */
  reopen(record: IntentRecord, call: Call): Promise<void> {
    call.attach(record);
    checkResendable(record, this.expiryOf(record), this.lookupUrl);
    record.attempts++;
    call.counted = 1;
    record.updatedAt = isoNow();
    return this.store.save(record);
  }

  /** When the server forgets the intent's key: as it said, or `keyRetentionMs` after the intent began. */
  expiryOf(record: IntentRecord): string {
    if (record.expiresAt !== undefined) return record.expiresAt;
    const at = Date.parse(record.createdAt) + this.#retentionMs;
    return Number.isFinite(at)
      ? new Date(Math.min(at, 8.64e15)).toISOString()
      : "+275760-09-13T00:00:00.000Z";
  }

  /** Count a retry before it is sent. Undefined when the call has no intent. */
  beforeRetry(call: Call): Promise<void> | undefined {
    const record = call.record;
    if (!record) return undefined;
    record.attempts++;
    call.counted++;
    this.#noteExpiry(record, call.lastResponse);
    record.updatedAt = isoNow();
    return this.store.save(record);
  }

  /**
   * A final answer: a named intent is kept as done (so beginning it again returns its key, and a
   * repeat is replayed rather than charged again); an intent without a name of its own (its id is
   * its key, as for `post()` without an intent) is deleted, since nothing can look it up again and
   * stores must not grow with every call. Returns the store's promise (undefined when there is no
   * intent), for the caller to await without an extra async function.
   */
  finish(call: Call, response: Response): Promise<void> | undefined {
    const record = call.record;
    if (!record) return undefined;
    if (response.headers.has(OPERATION_REF_HEADER)) this.advertised.add(originOf(call.url));
    if (record.id === record.key) return this.store.delete(record.id);
    record.status = IntentStatus.done;
    record.outcome = { status: response.status };
    record.lastAnswer = answerOf(call, response);
    this.#settle(record, call, response);
    return this.store.save(record);
  }

  /** The call gave up: the intent stays pending, with what the server last said. */
  giveUp(call: Call): Promise<void> | undefined {
    const record = call.record;
    if (!record || call.counted === 0) return undefined;
    const last = call.lastResponse;
    if (last?.headers.has(OPERATION_REF_HEADER)) this.advertised.add(originOf(call.url));
    if (last) record.lastAnswer = answerOf(call, last);
    this.#settle(record, call, last);
    return this.store.save(record);
  }

  /** The server said the outcome is uncertain: the intent leaves `pending()` for a person. */
  uncertain(call: Call, response: Response): Promise<void> | undefined {
    const record = call.record;
    if (!record) return undefined;
    record.status = IntentStatus.uncertain;
    record.lastAnswer = answerOf(call, response);
    this.#settle(record, call, response);
    return this.store.save(record);
  }

  /**
   * The server's lookup said the operation is finished (`response`, its saved answer) or uncertain:
   * recorded as a call's end would record it. An unnamed intent is deleted once finished, as after a call.
   */
  learned(
    record: IntentRecord,
    response: Response,
    state: "done" | "uncertain",
    ref?: string,
  ): Promise<void> {
    if (state === IntentStatus.done && record.id === record.key) return this.store.delete(record.id);
    record.status = state === "done" ? IntentStatus.done : IntentStatus.uncertain;
    if (state === "done") record.outcome = { status: response.status };
    record.lastAnswer = { status: response.status, operationState: state };
    if (ref !== undefined) record.lastAnswer.operationRef = ref;
    this.#noteExpiry(record, response);
    record.updatedAt = isoNow();
    return this.store.save(record);
  }

  /** Attempts counted but never sent (a refused or cut call) are taken back; expiry and time noted. */
  #settle(record: IntentRecord, call: Call, response: Response | undefined): void {
    record.attempts -= call.counted - call.attempts;
    call.counted = call.attempts;
    this.#noteExpiry(record, response);
    record.updatedAt = isoNow();
  }

  #noteExpiry(record: IntentRecord, response: Response | undefined): void {
    const at = response && expiresAt(response.headers);
    if (at !== undefined) record.expiresAt = at;
  }

  #requestOf(call: Call): StoredRequest {
    const headerPairs: [string, string][] = [];
    for (const name in call.headers) {
      if (!NOT_STORED.has(name) && name !== this.#keyHeader) headerPairs.push([name, call.headers[name]!]);
    }
    const request: StoredRequest = { method: call.method, url: call.url, headers: headerPairs };
    const stored = storeBody(call.body);
    if (stored) request.body = stored;
    return request;
  }
}

/**
 * Throw when a recorded intent may not be sent again: the server said its outcome is uncertain (a
 * person must look: {@link OperationUncertainError}), or its key expired on the server at `expiry`
 * ({@link IntentExpiredError}). `lookupUrl` says where an uncertain one can be looked up.
 */
export function checkResendable(
  record: IntentRecord,
  expiry: string | undefined,
  lookupUrl?: (record: IntentRecord) => string | undefined,
): void {
  if (record.status === IntentStatus.uncertain) {
    const url = lookupUrl?.(record);
    throw new OperationUncertainError({
      intentId: record.id,
      key: record.key,
      attempts: 0,
      ...(record.lastAnswer?.operationRef !== undefined && {
        operationRef: record.lastAnswer.operationRef,
      }),
      ...(url !== undefined && { lookupUrl: url }),
    });
  }
  if (expiry !== undefined && Date.now() >= Date.parse(expiry))
    throw new IntentExpiredError(record.id, expiry);
}

/** What the server said, as kept with the intent. */
function answerOf(call: Call, response: Response): IntentAnswer {
  const answer: IntentAnswer = { status: response.status };
  const a = call.lastAnswer;
  if (a && a.status === response.status) {
    if (a.operationState !== undefined) answer.operationState = a.operationState;
    if (a.safeNewKey !== undefined) answer.safeNewKey = a.safeNewKey;
    if (a.operationRef !== undefined) answer.operationRef = a.operationRef;
  }
  answer.operationRef ??= response.headers.get(OPERATION_REF_HEADER) ?? undefined;
  if (answer.operationRef === undefined) delete answer.operationRef;
  return answer;
}

/** The origin of an absolute URL ("" for one that does not parse). */
export function originOf(url: string): string {
  try {
    return new URL(url).origin;
  } catch {
    return "";
  }
}
