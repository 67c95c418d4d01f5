/**
 * The agent side: `idempotentToolCalls({ connect })` gives each intended tool call ONE idempotency key,
 * made when the intent begins and stored with the call (the intent stores of `idem/client`: memory, a
 * file, PostgreSQL), and sends that key with every attempt: after a dropped connection (a new client is
 * connected), a timeout, a "still in progress" answer, and after a restart of the agent itself
 * (`pending()` and `resume()`).
 *
 * Timeline of one call (D = the call's deadline, shared by attempts and waits):
 *   the intent is written with the call (tool + arguments) BEFORE the first attempt can have an effect
 *   [count the attempt -> callTool({ name, arguments, _meta.idempotencyKey }) (per-try timeout, or D)]
 *   a result: the tool's answer (first run or replay): the intent is done, the result returned
 *             idem's "in progress" / "try again" tool error: wait its `retryAfterSeconds`, loop
 *             `operationState: "uncertain"`: the intent is marked so, OperationUncertainError
 *   the transport failed (connection closed, refused, reset) or the attempt timed out: the client is
 *             dropped and a new one connected for the next attempt, after a backoff with full jitter
 * A wait that would outlast D, or the attempts used up, gives up (the intent stays pending: its
 * outcome is unknown, and resuming it later with its key is safe).
 */
import type { CallToolRequest, CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { type BackoffOptions, fullJitterMs } from "../client/backoff.ts";
import { sameBody, storeBody } from "../client/body.ts";
import { CallDeadline, Cut } from "../client/deadline.ts";
import {
  AttemptsExhaustedError,
  CallAbortedError,
  DeadlineExceededError,
  DeadlineReason,
  type GiveUpDetails,
  type GiveUpError,
  IntentConflictError,
  IntentHasNoRequestError,
  IntentNotFoundError,
  OperationUncertainError,
} from "../client/errors.ts";
import {
  assertIntentId,
  type IntentRecord,
  IntentStatus,
  type IntentStore,
  isoNow,
  MemoryIntentStore,
  newIntentRecord,
} from "../client/intent-store.ts";
import { checkResendable } from "../client/ledger.ts";
import { canonicalJson } from "../core/index.ts";
import { type IdempotencyMeta, idempotencyMetaOf, KEY_META } from "./meta.ts";

/** What the helper needs of an MCP client: the SDK's `Client` has it. */
export interface ToolCaller {
  callTool(
    params: CallToolRequest["params"],
    resultSchema?: undefined,
    options?: { timeout?: number; signal?: AbortSignal },
  ): Promise<unknown>;
  close(): Promise<void>;
}

/** Options of {@link idempotentToolCalls}. */
export interface IdempotentToolCallsOptions {
  /** Makes a connected client (`new Client(...)`, then `connect(transport)`); called again after a transport failure. Required. */
  connect: () => Promise<ToolCaller>;
  /** Where intents are kept. Default: a `MemoryIntentStore` (lost on restart: use a file or PostgreSQL store for that). */
  store?: IntentStore;
  /** One deadline over all attempts and waits of a call, in ms. Default: 60,000. */
  deadlineMs?: number;
  /** One attempt's timeout, in ms (the SDK then cancels the request). Default: 30,000. */
  perTryTimeoutMs?: number;
  /**
   * Attempts per call. Neither "still in progress" answers nor attempts that could not connect (nothing
   * was sent) count: the deadline bounds those. Default: 6.
   */
  maxAttempts?: number;
  /** Backoff between attempts when the server gave no time (full jitter). Default: 200 ms base, 5 s cap. */
  backoff?: BackoffOptions;
  /** Also send the key as this tool argument, for servers that read only arguments. Default: none (`_meta` only). */
  argument?: string;
  /** Random numbers in [0, 1) for the jitter (tests). Default: `Math.random`. */
  random?: () => number;
}

/** Per-call options. */
export interface ToolCallOptions {
  /** The intent's id (e.g. `refund-order-42`): calling again with it reuses its key. Default: a new intent. */
  intent?: string;
  /** Cancels the call and its waits. */
  signal?: AbortSignal;
  /** This call's deadline in ms. Default: the helper's. */
  deadlineMs?: number;
}

/** The request of an intent as stored: `tools/call`, the tool, and the arguments as canonical JSON. */
const METHOD = "tools/call";
const urlOf = (tool: string) => `mcp:tools/${encodeURIComponent(tool)}`;
const toolOf = (url: string) => decodeURIComponent(url.slice("mcp:tools/".length));

const CONNECTION_CLOSED = -32000;
const REQUEST_TIMEOUT = -32001;
/** JSON-RPC errors: the server answered and refused (bad arguments, unknown tool). Not retried. */
function isAnswered(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code !== "number") return false;
  if (code === CONNECTION_CLOSED || code === REQUEST_TIMEOUT) return false;
  // StreamableHTTPError carries the HTTP status: credentials refused are an answer, the rest transport.
  if (code >= 100 && code < 600) return code === 401 || code === 403;
  return true;
}

/** Tool calls that keep one key per intent across retries, reconnects and restarts (see the file's header). */
export class IdempotentToolCalls {
  /** Where the intents are kept. */
  readonly store: IntentStore;
  readonly #o: IdempotentToolCallsOptions;
  #client: Promise<ToolCaller> | undefined;

  constructor(options: IdempotentToolCallsOptions) {
    if (typeof options?.connect !== "function") {
      throw new TypeError(
        "idempotentToolCalls(): option connect must be a function that returns a connected client",
      );
    }
    this.#o = options;
    this.store = options.store ?? new MemoryIntentStore();
  }

  /**
   * Call a tool once per intent: with `intent`, a call made before under that id (in this process or
   * one before a restart) is sent again with its key, and its result replayed by the server.
   */
  async callTool(
    params: { name: string; arguments?: Record<string, unknown> },
    options: ToolCallOptions = {},
  ): Promise<CallToolResult> {
    const body = storeBody(canonicalJson(params.arguments ?? {}));
    const request = { method: METHOD, url: urlOf(params.name), headers: [], body };
    let record: IntentRecord;
    if (options.intent === undefined) {
      record = newIntentRecord();
    } else {
      assertIntentId(options.intent);
      record = (await this.store.get(options.intent)) ?? newIntentRecord(options.intent);
    }
    if (record.request) {
      const prev = record.request;
      const what = prev.url !== request.url ? "tool" : sameBody(prev.body, body) ? undefined : "arguments";
      if (what) throw new IntentConflictError(record.id, what);
      this.#check(record);
    }
    record.request = request;
    return this.#run(record, params, options);
  }

  /**
   * Begin an intent now: its key is made and stored before any call (to log it, or to hand it to
   * another process); `callTool(..., { intent })` then sends it. Returns the stored intent.
   */
  begin(intent?: string): Promise<IntentRecord> {
    if (intent !== undefined) assertIntentId(intent);
    return this.store.create(newIntentRecord(intent));
  }

  /** Send a stored intent again with its key (after a restart: `for (const r of await pending()) ...`). */
  async resume(intentId: string, options: Omit<ToolCallOptions, "intent"> = {}): Promise<CallToolResult> {
    const record = await this.store.get(intentId);
    if (!record) throw new IntentNotFoundError(intentId);
    if (!record.request?.body || !("text" in record.request.body))
      throw new IntentHasNoRequestError(intentId);
    this.#check(record);
    const args = JSON.parse(record.request.body.text) as Record<string, unknown>;
    return this.#run(record, { name: toolOf(record.request.url), arguments: args }, options);
  }

  /** Intents without a final answer yet (their outcome unknown), oldest first. */
  pending(): Promise<IntentRecord[]> {
    return this.store.list({ status: IntentStatus.pending });
  }

  /** Give an intent up for good (after a person settled it): it leaves `pending()`. */
  async abandon(intentId: string): Promise<void> {
    const record = await this.store.get(intentId);
    if (!record) throw new IntentNotFoundError(intentId);
    record.status = IntentStatus.abandoned;
    record.updatedAt = isoNow();
    await this.store.save(record);
  }

  /** Close the current client, if one is connected. */
  async close(): Promise<void> {
    await this.#drop();
  }

  /** A recorded intent may be sent again: not uncertain, its key not expired on the server (as last said). */
  #check(record: IntentRecord): void {
    checkResendable(record, record.expiresAt);
  }

  #connected(): Promise<ToolCaller> {
    this.#client ??= this.#o.connect().catch((err: unknown) => {
      this.#client = undefined;
      throw err;
    });
    return this.#client;
  }

  async #drop(): Promise<void> {
    const client = this.#client;
    this.#client = undefined;
    if (client) await client.then((c) => c.close()).catch(() => {});
  }

  async #run(
    record: IntentRecord,
    params: { name: string; arguments?: Record<string, unknown> },
    options: Omit<ToolCallOptions, "intent">,
  ): Promise<CallToolResult> {
    const o = this.#o;
    const deadlineMs = options.deadlineMs ?? o.deadlineMs ?? 60_000;
    const deadline = new CallDeadline(deadlineMs, options.signal);
    const maxAttempts = Math.max(1, o.maxAttempts ?? 6);
    const perTryMs = o.perTryTimeoutMs ?? 30_000;
    const key = record.key;
    const call = {
      name: params.name,
      arguments: o.argument ? { ...params.arguments, [o.argument]: key } : (params.arguments ?? {}),
      _meta: { [KEY_META]: key },
    };
    let attempts = 0;
    let inProgress = 0;
    let unreached = 0;
    let lastError: unknown;
    let lastMeta: IdempotencyMeta | undefined;
    const details = (): GiveUpDetails => ({
      intentId: record.id,
      key,
      attempts,
      ...(lastError !== undefined && { lastError }),
      ...(lastMeta?.operationState !== undefined && { operationState: lastMeta.operationState }),
      ...(lastMeta?.safeNewKey !== undefined && { safeNewKey: lastMeta.safeNewKey }),
      ...(lastMeta?.operationRef !== undefined && { operationRef: lastMeta.operationRef }),
    });
    const giveUp = async (error: GiveUpError): Promise<never> => {
      if (lastMeta) record.lastAnswer = answerOf(lastMeta);
      record.updatedAt = isoNow();
      await this.store.save(record);
      throw error;
    };
    for (;;) {
      const stopped = deadline.stopped();
      if (stopped) {
        await giveUp(
          stopped === Cut.caller
            ? new CallAbortedError({ ...details(), reason: options.signal?.reason })
            : new DeadlineExceededError({ ...details(), reason: DeadlineReason.elapsed, deadlineMs }),
        );
      }
      // Counted (and the call recorded, on the first) before it is sent: a crash leaves it counted.
      record.attempts++;
      record.updatedAt = isoNow();
      await this.store.save(record);
      attempts++;
      let result: CallToolResult | undefined;
      let reached = false;
      try {
        const client = await this.#connected();
        reached = true;
        const timeout = Math.max(1, Math.min(perTryMs, deadline.remaining()));
        result = (await client.callTool(call, undefined, {
          timeout,
          signal: options.signal,
        })) as CallToolResult;
      } catch (err) {
        lastError = err;
        if (!reached) unreached++; // no connection: nothing was sent, so nothing happened
        if (reached && isAnswered(err)) {
          // The server refused the call itself (its arguments, an unknown tool): nothing ran.
          record.status = IntentStatus.done;
          record.outcome = { status: 400 };
          record.updatedAt = isoNow();
          await this.store.save(record);
          throw err;
        }
      }
      let waitMs: number | undefined;
      if (result) {
        lastError = undefined;
        const meta = idempotencyMetaOf(result);
        lastMeta = meta;
        if (meta?.expiresAt !== undefined) record.expiresAt = meta.expiresAt;
        if (meta?.operationState === "uncertain") {
          record.status = IntentStatus.uncertain;
          record.lastAnswer = answerOf(meta);
          record.updatedAt = isoNow();
          await this.store.save(record);
          throw new OperationUncertainError(details());
        }
        if (!(result.isError && meta?.retrySameKey === true)) return this.#finish(record, result, meta);
        // idem's "in progress" (the first call still running, or its lease not yet expired) or "try again".
        if (meta.code === "idempotency-key-in-flight" || meta.code === "idempotency-lease-lost") inProgress++;
        if (meta.retryAfterSeconds !== undefined) waitMs = meta.retryAfterSeconds * 1000;
      } else if ((lastError as { code?: unknown } | null)?.code !== REQUEST_TIMEOUT) {
        await this.#drop(); // connected again for the next attempt
      }
      if (attempts - inProgress - unreached >= maxAttempts)
        await giveUp(new AttemptsExhaustedError(details()));
      waitMs ??= fullJitterMs(attempts, o.backoff, o.random);
      if (waitMs > deadline.remaining()) {
        await giveUp(
          new DeadlineExceededError({ ...details(), reason: DeadlineReason.waitTooLong, waitMs, deadlineMs }),
        );
      }
      try {
        await deadline.sleep(waitMs);
      } catch {
        await giveUp(new CallAbortedError({ ...details(), reason: options.signal?.reason }));
      }
    }
  }

  /** A final answer: a named intent is kept as done, an unnamed one (its id is its key) deleted. */
  async #finish(record: IntentRecord, result: CallToolResult, meta: IdempotencyMeta | undefined) {
    if (record.id === record.key) {
      await this.store.delete(record.id);
      return result;
    }
    record.status = IntentStatus.done;
    record.outcome = { status: meta?.status ?? (result.isError ? 400 : 200) };
    if (meta) record.lastAnswer = answerOf(meta);
    record.updatedAt = isoNow();
    await this.store.save(record);
    return result;
  }
}

function answerOf(meta: IdempotencyMeta): NonNullable<IntentRecord["lastAnswer"]> {
  return {
    status: meta.status ?? 200,
    ...(meta.operationState !== undefined && { operationState: meta.operationState }),
    ...(meta.safeNewKey !== undefined && { safeNewKey: meta.safeNewKey }),
    ...(meta.operationRef !== undefined && { operationRef: meta.operationRef }),
  };
}

/** The agent-side helper (see {@link IdempotentToolCalls}). */
export function idempotentToolCalls(options: IdempotentToolCallsOptions): IdempotentToolCalls {
  return new IdempotentToolCalls(options);
}
