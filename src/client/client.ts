/**
 * The retrying client: one key per intent, retries only for outcomes that may change, the server's
 * Retry-After first and full-jitter backoff otherwise, one deadline for the whole call, a retry
 * budget shared by every call, and a circuit breaker.
 *
 * This file is the public face only: it turns each method's arguments into a {@link Call}, asks the
 * intent ledger (`ledger.ts`) to bind the call to its intent, and hands it to the attempt loop
 * (`attempt-loop.ts`), which classifies each outcome with `answer.ts`.
 */
import { AttemptLoop } from "./attempt-loop.ts";
import { loadBody } from "./body.ts";
import type { CircuitBreaker } from "./breaker.ts";
import type { RetryBudget } from "./budget.ts";
import {
  Call,
  callOptions,
  isPromise,
  methodOf,
  NO_OPTIONS,
  OWN_FIELDS,
  POST_OWN_FIELDS,
  prepareCall,
} from "./call.ts";
import {
  IntentExpiredError,
  IntentHasNoRequestError,
  IntentNotFoundError,
  NewKeyNotSafeError,
  OperationUncertainError,
} from "./errors.ts";
import { toHeaderMap } from "./headers.ts";
import {
  type IntentRecord,
  type IntentRef,
  IntentStatus,
  type IntentStore,
  isoNow,
  newIntentRecord,
} from "./intent-store.ts";
import { newIdempotencyKey } from "./key.ts";
import { IntentLedger, originOf } from "./ledger.ts";
import { DEFAULT_OPERATIONS_PATH, lookupUrlOf, type OperationStatus, readLookup } from "./operations.ts";
import {
  type CallOptions,
  type ClientOptions,
  defaultStore,
  type RequestOptions,
  Settings,
} from "./options.ts";

const NO_POST_OPTIONS: RequestOptions & { intent?: IntentRef } = NO_OPTIONS as RequestOptions;
/** How long `resume()` lets the server hold its lookup of an operation still in progress, in seconds. */
const RESUME_WAIT_S = 5;
/** What a held lookup's attempt gets past the wait, before the client stops waiting for it. */
const LOOKUP_MARGIN_MS = 2_000;

/**
 * The retrying client (see the module's notes); made by {@link createClient}. Each call is bound to an
 * intent, kept in `store`, so that every retry, even after a restart, sends the same key.
 */
export class IdemClient {
  /** Where the intents are kept (`ClientOptions.store`; default in memory). */
  readonly store: IntentStore;
  /** The retry budget every call of this client shares; undefined when turned off. */
  readonly budget: RetryBudget | undefined;
  /** The circuit breaker every call of this client shares; undefined when turned off. */
  readonly breaker: CircuitBreaker | undefined;
  readonly #baseUrl: string | undefined;
  readonly #ledger: IntentLedger;
  readonly #loop: AttemptLoop;
  readonly #settings: Settings;
  #lastUrl: string | undefined;
  #lastHref = "";

  constructor(options: ClientOptions = {}) {
    const settings = new Settings(options);
    this.store = defaultStore(options);
    this.budget = settings.budget;
    this.breaker = settings.breaker;
    this.#baseUrl = options.baseUrl?.toString();
    this.#ledger = new IntentLedger(this.store, settings.keyHeader, settings.keyRetentionMs);
    this.#loop = new AttemptLoop(settings, this.#ledger);
    this.#settings = settings;
    const path = settings.operationsPath;
    if (path !== false) {
      this.#ledger.lookupUrl = (r) =>
        r.request ? lookupUrlOf(r.request.url, path, r.lastAnswer?.operationRef) : undefined;
    }
  }

  /**
   * Begin an intent (or find it again): with an `id` that is already stored, the stored intent and
   * its key come back, so `await client.intent("order-42")` after a restart reuses the key. Without
   * an id, a new intent with a random id. `key` brings your own key for a new intent.
   */
  intent(id?: string, options: { key?: string } = {}): Promise<IntentRecord> {
    return this.#ledger.begin(id, options.key);
  }

  /** Alias of {@link intent}. */
  begin(id?: string, options?: { key?: string }): Promise<IntentRecord> {
    return this.intent(id, options);
  }

  /**
   * Send the intent's request, retrying with its key until a final answer, and return that answer.
   * The request is recorded with the intent before the first attempt; calling again with the same
   * intent and a different method, URL or body throws `IntentConflictError`.
   * An intent id that is not stored yet begins a new intent with that id.
   */
  async request(intent: IntentRef, url: string | URL, init: RequestOptions = NO_OPTIONS): Promise<Response> {
    const prepared = this.#prepareInit(url, init);
    const call = isPromise(prepared) ? await prepared : prepared;
    const record = await this.#ledger.load(intent);
    return await this.#loop.run(call, this.#ledger.bind(record, call, false));
  }

  /**
   * POST `body` under an intent (a new one unless `options.intent` names one). A body that is not a
   * string, bytes, Blob or URLSearchParams is sent as JSON.
   */
  post(
    url: string | URL,
    body?: unknown,
    options: RequestOptions & { intent?: IntentRef } = NO_POST_OPTIONS,
  ): Promise<Response> {
    // Not an async function, to save the success path a promise and its turns; so every throw here
    // is turned into a rejection by hand.
    try {
      let payload: BodyInit | null;
      const headers = toHeaderMap(options.headers);
      if (
        body === undefined ||
        typeof body === "string" ||
        body instanceof Uint8Array ||
        body instanceof ArrayBuffer ||
        body instanceof URLSearchParams ||
        (typeof Blob !== "undefined" && body instanceof Blob)
      ) {
        payload = (body as BodyInit | undefined) ?? null;
      } else {
        payload = JSON.stringify(body);
        headers["content-type"] ??= "application/json";
      }
      const prepared = prepareCall(this.#resolve(url), options, "POST", headers, payload, POST_OWN_FIELDS);
      const intent = options.intent;
      if (intent !== undefined) {
        const send = async (call: Call) => {
          const record = await this.#ledger.load(intent);
          return await this.#loop.run(call, this.#ledger.bind(record, call, false));
        };
        return isPromise(prepared) ? prepared.then(send) : send(prepared);
      }
      // A new intent: recorded together with its request in one write.
      if (isPromise(prepared)) return prepared.then((call) => this.#sendNew(call));
      return this.#sendNew(prepared);
    } catch (err) {
      return Promise.reject(err);
    }
  }

  #sendNew(call: Call): Promise<Response> {
    return this.#loop.run(call, this.#ledger.bind(newIntentRecord(), call, true));
  }

  /** Intents without a final answer yet, oldest first: after a restart, resume each of these. */
  pending(): Promise<IntentRecord[]> {
    return this.store.list({ status: IntentStatus.pending });
  }

  /**
   * Send a stored intent's request again, with its key, as recorded. Throws `IntentExpiredError`
   * (sending nothing) when the key has outlived the server's retention, and
   * `OperationUncertainError` for an intent the server called uncertain.
   */
  async resume(intent: IntentRef, options: CallOptions = NO_OPTIONS): Promise<Response> {
    const record = await this.#stored(intent);
    const call = this.#replayOf(record, options);
    if (record.status === IntentStatus.pending && this.#offersLookup(record)) {
      const expiry = this.#ledger.expiryOf(record);
      if (Date.now() >= Date.parse(expiry)) throw new IntentExpiredError(record.id, expiry);
      // Ask first: a finished operation's saved answer comes back without its request being sent.
      const known = await this.status(record, { ...options, waitSeconds: RESUME_WAIT_S });
      if (known.finished) return known.response;
      if (known.state === "uncertain") {
        throw new OperationUncertainError({
          intentId: record.id,
          key: record.key,
          attempts: 0,
          lookupUrl: known.lookupUrl,
          ...(known.operationRef !== undefined && { operationRef: known.operationRef }),
        });
      }
      await known.response.body?.cancel();
      // In progress past the wait, unknown to the server, or no lookup: sent again with its key.
    }
    return await this.#loop.run(call, this.#ledger.reopen(record, call));
  }

  /**
   * Ask the server what became of an intent's operation, without sending its request: one GET to its
   * operation lookup (`operationsPath`), by the reference an earlier answer gave, else by the intent's
   * key. A finished operation comes back with its saved answer (`finished`, `response`, exactly as a
   * replay), and the intent is recorded done; an uncertain one marks the intent uncertain. While it is
   * in progress, `waitSeconds` asks the server to hold the request until it finishes (bounded there).
   * Sent with the client's headers (credentials), retries, deadline and breaker, never with the body.
   */
  async status(
    intent: IntentRef,
    options: CallOptions & { waitSeconds?: number } = NO_OPTIONS,
  ): Promise<OperationStatus> {
    const record = await this.#stored(intent);
    const request = record.request;
    if (!request) throw new IntentHasNoRequestError(record.id);
    const path = this.#settings.operationsPath || DEFAULT_OPERATIONS_PATH;
    const ref = record.lastAnswer?.operationRef;
    const url = lookupUrlOf(request.url, path, ref, options.waitSeconds);
    const headers: Record<string, string> = {};
    if (!ref) headers["idempotency-key"] = this.#settings.quoteKey ? `"${record.key}"` : record.key;
    const { waitSeconds, ...callOpts } = options;
    if (waitSeconds !== undefined && waitSeconds > 0) {
      // The server holds the GET up to the wait: give the attempt that long, plus a margin.
      const atLeast = waitSeconds * 1000 + LOOKUP_MARGIN_MS;
      callOpts.perTryTimeoutMs = Math.max(callOpts.perTryTimeoutMs ?? this.#settings.perTryMs, atLeast);
    }
    const response = await this.requestWithoutKey(url, { ...callOpts, headers });
    const known = await readLookup(response, url);
    if (known.finished) {
      await this.#ledger.learned(record, response, "done", known.operationRef);
    } else if (known.state === "uncertain") {
      await this.#ledger.learned(record, response, "uncertain", known.operationRef);
    }
    return known;
  }

  /** Whether to ask the lookup before sending an intent again: the server offers it, or it was configured. */
  #offersLookup(record: IntentRecord): boolean {
    const s = this.#settings;
    if (s.operationsPath === false || !record.request) return false;
    return (
      s.operationsSet ||
      record.lastAnswer?.operationRef !== undefined ||
      this.#ledger.advertised.has(originOf(record.request.url))
    );
  }

  /**
   * Send a stored intent's request again under a NEW key, when the server said a new key cannot
   * duplicate it: its last answer carried `safe_new_key: true` (e.g. 422 key reused for another
   * request, or a 503 before anything was claimed). The intent keeps its id and gets a fresh key and
   * attempt count. Otherwise throws `NewKeyNotSafeError` and sends nothing.
   */
  async retryWithNewKey(intent: IntentRef, options: CallOptions = NO_OPTIONS): Promise<Response> {
    const record = await this.#stored(intent);
    if (record.lastAnswer?.safeNewKey !== true || record.status === IntentStatus.uncertain) {
      throw new NewKeyNotSafeError(record.id);
    }
    const call = this.#replayOf(record, options);
    record.key = newIdempotencyKey();
    record.status = IntentStatus.pending;
    record.attempts = 0;
    record.createdAt = isoNow();
    delete record.outcome;
    delete record.lastAnswer;
    delete record.expiresAt;
    return await this.#loop.run(call, this.#ledger.reopen(record, call));
  }

  /** Give up on an intent for good: it leaves `pending()`. Its key is kept, never reused. */
  async abandon(intent: IntentRef): Promise<void> {
    const record = await this.#stored(intent);
    record.status = IntentStatus.abandoned;
    record.updatedAt = isoNow();
    await this.store.save(record);
  }

  /**
   * Send a request without an intent or a key, with the same retries, deadline, budget and breaker.
   * For safe methods (GET, HEAD...) whose repeats are harmless by definition. Used by
   * `withIdempotency` for methods that get no key.
   */
  async requestWithoutKey(url: string | URL, init: RequestOptions = NO_OPTIONS): Promise<Response> {
    const prepared = this.#prepareInit(url, init);
    return await this.#loop.run(isPromise(prepared) ? await prepared : prepared, undefined);
  }

  async #stored(intent: IntentRef): Promise<IntentRecord> {
    const id = typeof intent === "string" ? intent : intent.id;
    const record = await this.store.get(id);
    if (!record) throw new IntentNotFoundError(id);
    return record;
  }

  /** A call that sends a stored intent's request as recorded. */
  #replayOf(record: IntentRecord, options: CallOptions): Call {
    const request = record.request;
    if (!request) throw new IntentHasNoRequestError(record.id);
    const headers = toHeaderMap(request.headers);
    return new Call(
      request.method,
      request.url,
      headers,
      loadBody(request.body),
      undefined,
      callOptions(options),
    );
  }

  /** A call from a fetch-style `init` (method, headers and body taken from it). */
  #prepareInit(url: string | URL, init: RequestOptions): Call | Promise<Call> {
    return prepareCall(
      this.#resolve(url),
      init,
      methodOf(init),
      toHeaderMap(init.headers),
      init.body,
      OWN_FIELDS,
    );
  }

  #resolve(url: string | URL): string {
    if (url instanceof URL) return url.href;
    if (url === this.#lastUrl) return this.#lastHref;
    const base = this.#baseUrl ?? (globalThis as { location?: { href?: string } }).location?.href;
    const href = base ? new URL(url, base).href : url;
    this.#lastUrl = url;
    this.#lastHref = href;
    return href;
  }
}

/** Create a client. See `ClientOptions` for every option and its default. */
export function createClient(options: ClientOptions = {}): IdemClient {
  return new IdemClient(options);
}
