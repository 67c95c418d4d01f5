/**
 * The retrying client: one key per intent, retries only for outcomes that may change, the server's
 * Retry-After first and full-jitter backoff otherwise, one deadline for the whole call, a retry
 * budget shared by every call, and a circuit breaker.
 *
 * Why the loop itself is hand-written rather than cockatiel's RetryPolicy: a retry here has to be
 * decided per HTTP response (status sets, Retry-After that replaces the backoff), must be refused
 * *before* a wait that would outlast the call's deadline, must ask a budget shared across calls, and
 * must throw errors that carry the last response. RetryPolicy decides from the result alone and
 * always sleeps its backoff, so most of that would be fought rather than reused.
 */
import { type BackoffOptions, fullJitterMs } from "./backoff.ts";
import { loadBody, type ReplayableBody, sameBody, storeBody, toReplayable } from "./body.ts";
import { type BreakerPermit, CircuitBreaker, type CircuitBreakerOptions } from "./breaker.ts";
import { RetryBudget, type RetryBudgetOptions } from "./budget.ts";
import { CallDeadline, StopCause } from "./deadline.ts";
import {
  AttemptsExhaustedError,
  CallAbortedError,
  CircuitOpenError,
  DeadlineExceededError,
  DeadlineReason,
  type GiveUpDetails,
  type GiveUpError,
  IntentConflictError,
  IntentHasNoRequestError,
  IntentNotFoundError,
  RetryBudgetExhaustedError,
} from "./errors.ts";
import { type CallInfo, type ClientHooks, emit } from "./events.ts";
import {
  assertIntentId,
  type IntentRecord,
  type IntentRef,
  IntentStatus,
  type IntentStore,
  MemoryIntentStore,
  newIntentRecord,
  type StoredRequest,
} from "./intent-store.ts";
import { retryAfterFrom } from "./retry-after.ts";

/** What the client needs from `fetch`. The global `fetch` fits, and so do most wrappers of it. */
export type FetchLike = (url: string, init: RequestInit) => Promise<Response>;

export const DEFAULT_RETRY_STATUSES: readonly number[] = [408, 409, 429, 500, 502, 503, 504];
export const DEFAULT_MAX_ATTEMPTS = 5;
export const DEFAULT_DEADLINE_MS = 10_000;
export const DEFAULT_PER_TRY_TIMEOUT_MS = 2_000;
export const DEFAULT_KEY_HEADER = "Idempotency-Key";

/** Which outcomes are retried, how often, and how long to wait between them. */
export interface RetryOptions extends BackoffOptions {
  /** Most attempts per call, the first included. Default 5. */
  maxAttempts?: number;
  /**
   * Response statuses that are retried: outcomes that may change. Default 408, 409, 429, 500, 502,
   * 503, 504. (409 is here because an idem server answers 409 only for "this key is still in
   * progress"; drop it if your server also uses 409 for business conflicts.) Network errors and
   * per-try timeouts are always retried: their outcome is unknown. Every other status is a final
   * answer and is returned at once.
   */
  statuses?: readonly number[];
  /** Random numbers in [0, 1) for the jitter. Default `Math.random`. */
  random?: () => number;
}

/** Options of {@link createClient}. Every one is optional. */
export interface ClientOptions {
  /** Relative URLs are resolved against this. Default: none (in a browser, the page's URL). */
  baseUrl?: string | URL;
  /**
   * The fetch function. Default: the global `fetch`, looked up at each call (so a polyfill or a test
   * stub installed later is used).
   */
  fetch?: FetchLike;
  /** Where intents are kept. Default: a new {@link MemoryIntentStore} (lost on restart). */
  store?: IntentStore;
  /**
   * Headers added to every attempt and never stored with an intent: the place for credentials.
   * A function is called once per call (e.g. to fetch a fresh token). Default: none.
   */
  headers?: HeadersInit | (() => HeadersInit | Promise<HeadersInit>);
  /** The header carrying the key. Default `"Idempotency-Key"`. */
  keyHeader?: string;
  /**
   * How the key is written: `"token"` sends it bare (as Stripe does), `"sf-string"` quotes it as an
   * RFC 8941 string, as the IETF Idempotency-Key draft specifies. idem servers accept both.
   * Default `"token"`.
   */
  keyFormat?: "token" | "sf-string";
  /** Retry policy. Defaults: see {@link RetryOptions}. */
  retry?: RetryOptions;
  /** Time for a whole call: every attempt and every wait. Default 10,000 ms. */
  deadlineMs?: number;
  /** Time for one attempt (until response headers arrive). Default 2,000 ms. */
  perTryTimeoutMs?: number;
  /**
   * Retry budget shared by every call of this client (pass one {@link RetryBudget} to several
   * clients to share it wider), or `false` for none. Default `new RetryBudget()`: ratio 0.1, cap 10.
   */
  budget?: RetryBudget | RetryBudgetOptions | false;
  /**
   * Circuit breaker consulted before every attempt (pass one {@link CircuitBreaker} to several
   * clients to share it), or `false` for none. Default `new CircuitBreaker()`: opens after 5 failures
   * in a row, probes after 5 s.
   */
  breaker?: CircuitBreaker | CircuitBreakerOptions | false;
  /** Hooks for logging and metrics. Default: none. */
  on?: ClientHooks;
  /**
   * What a call that gave up after receiving a response does: `"error"` throws the typed error
   * (with `lastResponse`, body buffered); `"response"` returns that last response as `fetch` would.
   * Calls that got no response always throw. Default `"error"` (`"response"` in `withIdempotency`).
   */
  giveUpWith?: "error" | "response";
}

/** Per-call settings, on top of the usual `fetch` init. */
export interface CallOptions {
  /** This call's deadline. Default: the client's `deadlineMs`. */
  deadlineMs?: number;
  /** This call's per-try timeout. Default: the client's `perTryTimeoutMs`. */
  perTryTimeoutMs?: number;
  /** This call's attempt limit. Default: the client's `retry.maxAttempts`. */
  maxAttempts?: number;
  /** Cancels the call at once, including a wait between attempts. */
  signal?: AbortSignal | null;
}

export type RequestOptions = Omit<RequestInit, "signal"> & CallOptions;

/** What the loop sends, whatever it came from. */
interface Call extends CallInfo {
  headers: Headers;
  body: ReplayableBody | undefined;
  init: RequestInit;
  options: CallOptions;
  record?: IntentRecord;
}

const NO_BREAKER: BreakerPermit = { success() {}, failure() {}, release() {} };
const NOT_STORED = new Set(["authorization", "cookie", "proxy-authorization"]);

export class IdemClient {
  readonly store: IntentStore;
  readonly budget: RetryBudget | undefined;
  readonly breaker: CircuitBreaker | undefined;
  readonly #fetch: FetchLike | undefined;
  readonly #baseUrl: string | undefined;
  readonly #headers: ClientOptions["headers"];
  readonly #keyHeader: string;
  readonly #quoteKey: boolean;
  readonly #statuses: ReadonlySet<number>;
  readonly #retry: RetryOptions;
  readonly #maxAttempts: number;
  readonly #deadlineMs: number;
  readonly #perTryMs: number;
  readonly #on: ClientHooks;
  readonly #giveUpWithResponse: boolean;

  constructor(options: ClientOptions = {}) {
    this.#fetch = options.fetch;
    this.#baseUrl = options.baseUrl?.toString();
    this.store = options.store ?? new MemoryIntentStore();
    this.#headers = options.headers;
    this.#keyHeader = options.keyHeader ?? DEFAULT_KEY_HEADER;
    this.#quoteKey = options.keyFormat === "sf-string";
    this.#retry = options.retry ?? {};
    this.#statuses = new Set(this.#retry.statuses ?? DEFAULT_RETRY_STATUSES);
    this.#maxAttempts = this.#retry.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
    this.#deadlineMs = options.deadlineMs ?? DEFAULT_DEADLINE_MS;
    this.#perTryMs = options.perTryTimeoutMs ?? DEFAULT_PER_TRY_TIMEOUT_MS;
    this.budget =
      options.budget === false
        ? undefined
        : options.budget instanceof RetryBudget
          ? options.budget
          : new RetryBudget(options.budget);
    this.breaker =
      options.breaker === false
        ? undefined
        : options.breaker instanceof CircuitBreaker
          ? options.breaker
          : new CircuitBreaker(options.breaker);
    this.#on = options.on ?? {};
    this.#giveUpWithResponse = options.giveUpWith === "response";
  }

  /**
   * Begin an intent (or find it again): with an `id` that is already stored, the stored intent and
   * its key come back, so `await client.intent("order-42")` after a restart reuses the key. Without
   * an id, a new intent with a random id. `key` brings your own key for a new intent.
   */
  async intent(id?: string, options: { key?: string } = {}): Promise<IntentRecord> {
    if (id !== undefined) assertIntentId(id);
    const fresh = newIntentRecord(id);
    if (options.key !== undefined) {
      assertIntentId(options.key);
      fresh.key = options.key;
      if (id === undefined) fresh.id = options.key;
    }
    return this.store.create(fresh);
  }

  /** Alias of {@link intent}. */
  begin(id?: string, options?: { key?: string }): Promise<IntentRecord> {
    return this.intent(id, options);
  }

  /**
   * Send the intent's request, retrying with its key until a final answer, and return that answer.
   * The request is recorded with the intent before the first attempt; calling again with the same
   * intent and a different method, URL or body throws {@link IntentConflictError}.
   * An intent id that is not stored yet begins a new intent with that id.
   */
  async request(intent: IntentRef, url: string | URL, init: RequestOptions = {}): Promise<Response> {
    const record = await this.#load(intent);
    const { headers: initHeaders, body: initBody, method: initMethod, ...rest } = init;
    const { deadlineMs, perTryTimeoutMs, maxAttempts, signal, ...fetchInit } = rest;
    const method = (initMethod ?? "GET").toUpperCase();
    const { body, contentType } = await toReplayable(initBody);
    const headers = new Headers(initHeaders);
    if (contentType && !headers.has("content-type")) headers.set("content-type", contentType);

    const request: StoredRequest = {
      method,
      url: this.#resolve(url),
      headers: [...headers].filter(([name]) => !NOT_STORED.has(name) && !this.#isKeyHeader(name)),
    };
    const stored = storeBody(body);
    if (stored) request.body = stored;
    if (record.request) {
      const prev = record.request;
      const differs =
        prev.method !== request.method ? "method" : prev.url !== request.url ? "URL" : undefined;
      const what = differs ?? (sameBody(prev.body, request.body) ? undefined : "body");
      if (what) throw new IntentConflictError(record.id, what);
    } else {
      record.request = request;
      record.updatedAt = new Date().toISOString();
      await this.store.save(record); // recorded BEFORE the first attempt can have any effect
    }
    return this.#send(
      {
        intentId: record.id,
        key: record.key,
        method,
        url: request.url,
        headers: await this.#withClientHeaders(headers),
        body,
        init: fetchInit,
        options: { deadlineMs, perTryTimeoutMs, maxAttempts, signal },
        record,
      },
      true,
    );
  }

  /**
   * POST `body` under an intent (a new one unless `options.intent` names one). A body that is not a
   * string, bytes, Blob or URLSearchParams is sent as JSON.
   */
  async post(
    url: string | URL,
    body?: unknown,
    options: RequestOptions & { intent?: IntentRef } = {},
  ): Promise<Response> {
    const { intent, ...init } = options;
    const headers = new Headers(init.headers);
    let payload: BodyInit | undefined;
    if (
      body === undefined ||
      typeof body === "string" ||
      body instanceof Uint8Array ||
      body instanceof ArrayBuffer ||
      body instanceof URLSearchParams ||
      (typeof Blob !== "undefined" && body instanceof Blob)
    ) {
      payload = body as BodyInit | undefined;
    } else {
      payload = JSON.stringify(body);
      if (!headers.has("content-type")) headers.set("content-type", "application/json");
    }
    return this.request(intent ?? (await this.intent()), url, {
      ...init,
      method: "POST",
      headers,
      body: payload ?? null,
    });
  }

  /** Intents without a final answer yet, oldest first: after a restart, resume each of these. */
  pending(): Promise<IntentRecord[]> {
    return this.store.list({ status: IntentStatus.pending });
  }

  /** Send a stored intent's request again, with its key, as recorded. */
  async resume(intent: IntentRef, options: CallOptions = {}): Promise<Response> {
    const id = typeof intent === "string" ? intent : intent.id;
    const record = await this.store.get(id);
    if (!record) throw new IntentNotFoundError(id);
    const request = record.request;
    if (!request) throw new IntentHasNoRequestError(id);
    return this.#send(
      {
        intentId: record.id,
        key: record.key,
        method: request.method,
        url: request.url,
        headers: await this.#withClientHeaders(new Headers(request.headers)),
        body: loadBody(request.body),
        init: {},
        options,
        record,
      },
      true,
    );
  }

  /** Give up on an intent for good: it leaves `pending()`. Its key is kept, never reused. */
  async abandon(intent: IntentRef): Promise<void> {
    const id = typeof intent === "string" ? intent : intent.id;
    const record = await this.store.get(id);
    if (!record) throw new IntentNotFoundError(id);
    record.status = IntentStatus.abandoned;
    record.updatedAt = new Date().toISOString();
    await this.store.save(record);
  }

  /**
   * Send a request without an intent or a key, with the same retries, deadline, budget and breaker.
   * For safe methods (GET, HEAD...) whose repeats are harmless by definition. Used by
   * `withIdempotency` for methods that get no key.
   */
  async requestWithoutKey(url: string | URL, init: RequestOptions = {}): Promise<Response> {
    const { headers: initHeaders, body: initBody, method: initMethod, ...rest } = init;
    const { deadlineMs, perTryTimeoutMs, maxAttempts, signal, ...fetchInit } = rest;
    const { body, contentType } = await toReplayable(initBody);
    const headers = new Headers(initHeaders);
    if (contentType && !headers.has("content-type")) headers.set("content-type", contentType);
    return this.#send(
      {
        method: (initMethod ?? "GET").toUpperCase(),
        url: this.#resolve(url),
        headers: await this.#withClientHeaders(headers),
        body,
        init: fetchInit,
        options: { deadlineMs, perTryTimeoutMs, maxAttempts, signal },
      },
      false,
    );
  }

  async #load(intent: IntentRef): Promise<IntentRecord> {
    if (typeof intent === "string") {
      return (await this.store.get(intent)) ?? this.intent(intent);
    }
    return (await this.store.get(intent.id)) ?? this.store.create(intent);
  }

  #resolve(url: string | URL): string {
    const base = this.#baseUrl ?? (globalThis as { location?: { href?: string } }).location?.href;
    if (url instanceof URL) return url.href;
    if (!base) return url;
    return new URL(url, base).href;
  }

  #isKeyHeader(name: string): boolean {
    return name.toLowerCase() === this.#keyHeader.toLowerCase();
  }

  async #withClientHeaders(headers: Headers): Promise<Headers> {
    if (!this.#headers) return headers;
    const extra = typeof this.#headers === "function" ? await this.#headers() : this.#headers;
    const out = new Headers(extra);
    for (const [name, value] of headers) out.set(name, value);
    return out;
  }

  /*
   * Timeline of one call (D = deadline, shared by everything below):
   *   budget earns ratio -> [breaker permit -> attempt (per-try timeout, D) -> classify]
   *   final answer: mark the intent done, return
   *   otherwise: attempts left? wait (Retry-After or jitter) fits before D? budget token?
   *              then drop the failed body, sleep (cut short by D or the caller), loop
   * Any "no" throws a GiveUpError and leaves the intent pending: the outcome may be unknown.
   */
  async #send(call: Call, withKey: boolean): Promise<Response> {
    const startedAt = Date.now();
    const maxAttempts = call.options.maxAttempts ?? this.#maxAttempts;
    const perTryMs = call.options.perTryTimeoutMs ?? this.#perTryMs;
    const deadlineMs = call.options.deadlineMs ?? this.#deadlineMs;
    if (withKey && call.key !== undefined) {
      call.headers.set(this.#keyHeader, this.#quoteKey ? `"${call.key}"` : call.key);
    }
    const info: CallInfo = { method: call.method, url: call.url };
    if (call.intentId !== undefined) info.intentId = call.intentId;
    if (call.key !== undefined) info.key = call.key;
    const fetchFn = this.#fetch ?? globalThis.fetch;
    const deadline = new CallDeadline(deadlineMs, call.options.signal);
    let attempts = 0;
    let lastResponse: Response | undefined;
    let lastError: unknown;

    const details = (): GiveUpDetails => {
      const d: GiveUpDetails = { intentId: call.intentId ?? "", key: call.key ?? "", attempts };
      if (lastResponse) d.lastResponse = lastResponse;
      if (lastError !== undefined) d.lastError = lastError;
      return d;
    };
    const stopped = (): GiveUpError =>
      deadline.stoppedBy === StopCause.caller
        ? new CallAbortedError({ ...details(), reason: deadline.callerReason })
        : new DeadlineExceededError({ ...details(), reason: DeadlineReason.elapsed, deadlineMs });

    this.budget?.recordRequest();
    try {
      if (deadline.stoppedBy) return await this.#giveUp(call, info, stopped(), attempts);
      for (;;) {
        const permit = this.breaker ? this.breaker.tryAcquire() : NO_BREAKER;
        if (!permit) {
          const err = new CircuitOpenError({ ...details(), retryInMs: this.breaker?.retryInMs() ?? 0 });
          return await this.#giveUp(call, info, err, attempts);
        }
        attempts++;
        const attemptStart = Date.now();
        const tryer = deadline.attempt(perTryMs);
        let response: Response | undefined;
        let error: unknown;
        try {
          // Called through a local: a browser's fetch throws "Illegal invocation" when called as a
          // method of another object.
          response = await fetchFn(call.url, {
            ...call.init,
            method: call.method,
            headers: call.headers,
            ...(call.body !== undefined && { body: call.body }),
            signal: tryer.signal,
          });
        } catch (err) {
          error = err;
        } finally {
          tryer.done();
        }

        if (response && !this.#statuses.has(response.status)) {
          // A final answer, even if the deadline passed meanwhile: it is what happened.
          permit.success();
          emit(this.#on.attempt, {
            ...info,
            attempt: attempts,
            durationMs: Date.now() - attemptStart,
            status: response.status,
            retryable: false,
          });
          await this.#finish(call, attempts, response.status);
          emit(this.#on.done, {
            ...info,
            attempts,
            status: response.status,
            durationMs: Date.now() - startedAt,
          });
          return response;
        }
        if (deadline.stoppedBy) {
          permit.release(); // cut short by us: says nothing about the server
          await response?.body?.cancel().catch(() => {});
          return await this.#giveUp(call, info, stopped(), attempts);
        }
        if (response) {
          if (this.breaker?.failureStatuses.has(response.status)) permit.failure();
          else permit.success();
        } else {
          permit.failure();
        }
        emit(this.#on.attempt, {
          ...info,
          attempt: attempts,
          durationMs: Date.now() - attemptStart,
          ...(response ? { status: response.status } : { error }),
          retryable: true,
        });
        lastResponse = response;
        lastError = response ? undefined : error;

        if (attempts >= maxAttempts) {
          return await this.#giveUp(call, info, new AttemptsExhaustedError(details()), attempts);
        }
        const hint = response ? retryAfterFrom(response) : undefined;
        const delayMs = hint ?? fullJitterMs(attempts, this.#retry, this.#retry.random ?? Math.random);
        if (delayMs > deadline.remaining()) {
          const err = new DeadlineExceededError({
            ...details(),
            reason: DeadlineReason.waitTooLong,
            waitMs: delayMs,
            deadlineMs,
          });
          return await this.#giveUp(call, info, err, attempts);
        }
        if (this.budget && !this.budget.tryRetry()) {
          return await this.#giveUp(call, info, new RetryBudgetExhaustedError(details()), attempts);
        }
        // The failed attempt's body is not needed: release its connection now.
        if (response) {
          await response.body?.cancel().catch(() => {});
          lastResponse = withoutBody(response);
        }
        emit(this.#on.wait, {
          ...info,
          attempt: attempts,
          delayMs,
          source: hint !== undefined ? "retry-after" : "backoff",
          ...(response ? { status: response.status } : { error }),
        });
        try {
          await deadline.sleep(delayMs);
        } catch {
          return await this.#giveUp(call, info, stopped(), attempts);
        }
      }
    } finally {
      deadline.dispose();
    }
  }

  async #finish(call: Call, attempts: number, status: number): Promise<void> {
    const record = call.record;
    if (!record) return;
    record.status = IntentStatus.done;
    record.outcome = { status };
    record.attempts += attempts;
    record.updatedAt = new Date().toISOString();
    await this.store.save(record);
  }

  /** Record the attempts (the intent stays pending), report, then throw or return the last response. */
  async #giveUp(call: Call, info: CallInfo, error: GiveUpError, attempts: number): Promise<Response> {
    const record = call.record;
    if (record && attempts > 0) {
      record.attempts += attempts;
      record.updatedAt = new Date().toISOString();
      await this.store.save(record);
    }
    const last = error.lastResponse;
    // Only a response whose body is still there is handed back as the answer; one whose body was
    // discarded before a wait (deadline, abort or open circuit during a later step) only informs.
    if (last?.body && this.#giveUpWithResponse && !(error instanceof CallAbortedError)) {
      emit(this.#on.giveUp, { ...info, attempts, error });
      return last;
    }
    if (last && last.bodyUsed === false && last.body) {
      // Read the body into memory so the error can be inspected later without pinning a connection.
      const buffered = await buffer(last);
      Object.defineProperty(error, "lastResponse", { value: buffered, enumerable: true });
    }
    emit(this.#on.giveUp, { ...info, attempts, error });
    throw error;
  }
}

/** Create a client. See {@link ClientOptions} for every option and its default. */
export function createClient(options: ClientOptions = {}): IdemClient {
  return new IdemClient(options);
}

/** The same status and headers with an empty body (for responses whose body was discarded). */
function withoutBody(response: Response): Response {
  return new Response(null, {
    status: response.status,
    statusText: response.statusText,
    headers: response.headers,
  });
}

async function buffer(response: Response): Promise<Response> {
  let bytes: ArrayBuffer | null = null;
  try {
    bytes = await response.arrayBuffer();
  } catch {
    // The body could not be read (e.g. the deadline cut it): keep status and headers.
  }
  return new Response(bytes, {
    status: response.status,
    statusText: response.statusText,
    headers: response.headers,
  });
}
