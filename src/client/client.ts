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
import { CallDeadline, Cut } from "./deadline.ts";
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
  isoNow,
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
  /**
   * Time for one attempt, until its response headers arrive. Default 2,000 ms. (Reading a final
   * response's body is not timed by the client; neither is it cut by the call's signal once the
   * headers are in.)
   */
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

type HeaderMap = Record<string, string>;

/**
 * One call: what it sends (headers lower-cased, body replayable) and where the loop stands. A class,
 * so that every call has the same shape and the loop keeps its state here rather than in closures.
 */
class Call {
  intentId: string | undefined = undefined;
  key: string | undefined = undefined;
  record: IntentRecord | undefined = undefined;
  attempts = 0;
  lastResponse: Response | undefined = undefined;
  lastError: unknown = undefined;
  readonly method: string;
  readonly url: string;
  headers: HeaderMap;
  readonly body: ReplayableBody | undefined;
  /** The caller's other fetch init fields (credentials, redirect...), when there are any. */
  readonly init: RequestInit | undefined;
  readonly options: CallOptions;

  constructor(
    method: string,
    url: string,
    headers: HeaderMap,
    body: ReplayableBody | undefined,
    init: RequestInit | undefined,
    options: CallOptions,
  ) {
    this.method = method;
    this.url = url;
    this.headers = headers;
    this.body = body;
    this.init = init;
    this.options = options;
  }

  /** The call sends this intent's key. */
  attach(record: IntentRecord): void {
    this.record = record;
    this.intentId = record.id;
    this.key = record.key;
  }
}

const NO_BREAKER: BreakerPermit = { success() {}, failure() {}, release() {} };
const NOT_STORED = new Set(["authorization", "cookie", "proxy-authorization"]);
/** Fields of a call's init that the client handles itself instead of passing to fetch. */
const OWN_FIELDS: ReadonlySet<string> = new Set([
  "headers",
  "body",
  "method",
  "signal",
  "deadlineMs",
  "perTryTimeoutMs",
  "maxAttempts",
]);
/** The same, for `post()`, whose options also name the intent. */
const POST_OWN_FIELDS: ReadonlySet<string> = new Set([...OWN_FIELDS, "intent"]);
const NO_OPTIONS: RequestOptions & { intent?: IntentRef } = Object.freeze({});

export class IdemClient {
  readonly store: IntentStore;
  readonly budget: RetryBudget | undefined;
  readonly breaker: CircuitBreaker | undefined;
  readonly #fetch: FetchLike | undefined;
  readonly #baseUrl: string | undefined;
  readonly #headers: HeaderMap | (() => HeadersInit | Promise<HeadersInit>) | undefined;
  readonly #keyHeader: string;
  readonly #quoteKey: boolean;
  readonly #statuses: ReadonlySet<number>;
  readonly #retry: RetryOptions;
  readonly #maxAttempts: number;
  readonly #deadlineMs: number;
  readonly #perTryMs: number;
  readonly #on: ClientHooks;
  readonly #giveUpWithResponse: boolean;
  #lastUrl: string | undefined;
  #lastHref = "";

  constructor(options: ClientOptions = {}) {
    this.#fetch = options.fetch;
    this.#baseUrl = options.baseUrl?.toString();
    this.store = options.store ?? new MemoryIntentStore();
    const h = options.headers;
    this.#headers = typeof h === "function" ? h : h === undefined ? undefined : toHeaderMap(h);
    this.#keyHeader = (options.keyHeader ?? DEFAULT_KEY_HEADER).toLowerCase();
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
  async request(intent: IntentRef, url: string | URL, init: RequestOptions = NO_OPTIONS): Promise<Response> {
    const prepared = this.#prepareInit(url, init);
    const call = isPromise(prepared) ? await prepared : prepared;
    return await this.#requestWith(await this.#load(intent), call, false);
  }

  /**
   * POST `body` under an intent (a new one unless `options.intent` names one). A body that is not a
   * string, bytes, Blob or URLSearchParams is sent as JSON.
   */
  post(
    url: string | URL,
    body?: unknown,
    options: RequestOptions & { intent?: IntentRef } = NO_OPTIONS,
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
      const prepared = this.#prepare(url, options, "POST", headers, payload, POST_OWN_FIELDS);
      const intent = options.intent;
      if (intent !== undefined) {
        const send = async (call: Call) => await this.#requestWith(await this.#load(intent), call, false);
        return isPromise(prepared) ? prepared.then(send) : send(prepared);
      }
      // A new intent: recorded together with its request in one write.
      if (isPromise(prepared))
        return prepared.then((call) => this.#requestWith(newIntentRecord(), call, true));
      return this.#requestWith(newIntentRecord(), prepared, true);
    } catch (err) {
      return Promise.reject(err);
    }
  }

  /** Intents without a final answer yet, oldest first: after a restart, resume each of these. */
  pending(): Promise<IntentRecord[]> {
    return this.store.list({ status: IntentStatus.pending });
  }

  /** Send a stored intent's request again, with its key, as recorded. */
  async resume(intent: IntentRef, options: CallOptions = NO_OPTIONS): Promise<Response> {
    const id = typeof intent === "string" ? intent : intent.id;
    const record = await this.store.get(id);
    if (!record) throw new IntentNotFoundError(id);
    const request = record.request;
    if (!request) throw new IntentHasNoRequestError(id);
    const call = new Call(
      request.method,
      request.url,
      toHeaderMap(request.headers),
      loadBody(request.body),
      undefined,
      callOptions(options),
    );
    call.attach(record);
    return await this.#send(call, undefined);
  }

  /** Give up on an intent for good: it leaves `pending()`. Its key is kept, never reused. */
  async abandon(intent: IntentRef): Promise<void> {
    const id = typeof intent === "string" ? intent : intent.id;
    const record = await this.store.get(id);
    if (!record) throw new IntentNotFoundError(id);
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
    return await this.#send(isPromise(prepared) ? await prepared : prepared, undefined);
  }

  /**
   * The call for a request: `headers` (a map of the caller's headers made for this call, so it may be
   * changed), the body made replayable, the rest of `init` kept for fetch. Synchronous except for a
   * Blob body (read once, here).
   */
  /** A call from a fetch-style `init` (method, headers and body taken from it). */
  #prepareInit(url: string | URL, init: RequestOptions): Call | Promise<Call> {
    return this.#prepare(url, init, methodOf(init), toHeaderMap(init.headers), init.body, OWN_FIELDS);
  }

  #prepare(
    url: string | URL,
    init: RequestOptions,
    method: string,
    headers: HeaderMap,
    body: BodyInit | null | undefined,
    ownFields: ReadonlySet<string>,
  ): Call | Promise<Call> {
    if (typeof body === "string") return this.#call(url, init, method, headers, body, undefined, ownFields);
    const r = toReplayable(body);
    return isPromise(r)
      ? r.then((b) => this.#call(url, init, method, headers, b.body, b.contentType, ownFields))
      : this.#call(url, init, method, headers, r.body, r.contentType, ownFields);
  }

  #call(
    url: string | URL,
    init: RequestOptions,
    method: string,
    headers: HeaderMap,
    body: ReplayableBody | undefined,
    contentType: string | undefined,
    ownFields: ReadonlySet<string>,
  ): Call {
    if (contentType) headers["content-type"] ??= contentType;
    return new Call(
      method,
      this.#resolve(url),
      headers,
      body,
      fetchFields(init, ownFields),
      callOptions(init),
    );
  }

  /**
   * Record the request with the intent (unless it already is: then it must be the same request),
   * then send. Synchronous up to the store write, which `#send` awaits before the first attempt.
   */
  #requestWith(record: IntentRecord, call: Call, isNew: boolean): Promise<Response> {
    const headerPairs: [string, string][] = [];
    for (const name in call.headers) {
      if (!NOT_STORED.has(name) && name !== this.#keyHeader) headerPairs.push([name, call.headers[name]!]);
    }
    const request: StoredRequest = { method: call.method, url: call.url, headers: headerPairs };
    const stored = storeBody(call.body);
    if (stored) request.body = stored;
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
      return this.#send(call, undefined);
    }
    // Recorded BEFORE the first attempt can have any effect, so a crash cannot lose the key.
    record.request = request;
    if (isNew) return this.#send(call, this.store.create(record));
    record.updatedAt = isoNow();
    return this.#send(call, this.store.save(record));
  }

  async #load(intent: IntentRef): Promise<IntentRecord> {
    if (typeof intent === "string") {
      return (await this.store.get(intent)) ?? this.intent(intent);
    }
    return (await this.store.get(intent.id)) ?? this.store.create(intent);
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

  /*
   * Timeline of one call (D = the deadline, shared by everything below):
   *   the intent's write (if any) is awaited: nothing is sent before it is stored
   *   budget earns its ratio -> [breaker permit -> attempt (timer: per-try or D) -> classify]
   *   final answer: mark the intent done, return it
   *   otherwise: attempts left? the wait (Retry-After, else jitter) ends before D? a budget token?
   *              then drop the failed body, sleep (cut short only by the caller), loop
   * Any "no" throws a GiveUpError and leaves the intent pending: its outcome may be unknown.
   *
   * The success path is kept lean on purpose (bench/client.ts measures it against plain fetch): one
   * async function and no closures per call, one clock read before the first attempt, hook events
   * built only when a hook is set.
   */
  async #send(call: Call, written: Promise<IntentRecord> | Promise<void> | undefined): Promise<Response> {
    if (written) {
      const stored = await written;
      if (stored) call.attach(stored); // create() resolves to whichever record is stored
    }
    // The client's headers under the call's own (the call wins), then the key over both.
    const extra = this.#headers;
    if (extra) {
      call.headers =
        typeof extra === "function"
          ? { ...toHeaderMap(await extra()), ...call.headers }
          : { ...extra, ...call.headers };
    }
    const headers = call.headers;
    if (call.key !== undefined) headers[this.#keyHeader] = this.#quoteKey ? `"${call.key}"` : call.key;
    const opts = call.options;
    const maxAttempts = Math.max(1, opts.maxAttempts ?? this.#maxAttempts);
    const perTryMs = opts.perTryTimeoutMs ?? this.#perTryMs;
    const deadlineMs = opts.deadlineMs ?? this.#deadlineMs;
    const on = this.#on;
    const fetchFn = this.#fetch ?? globalThis.fetch;
    const startedAt = Date.now();
    const deadline = new CallDeadline(deadlineMs, opts.signal, startedAt);

    this.budget?.recordRequest();
    const early = deadline.stopped(startedAt);
    if (early) return this.#giveUp(call, this.#stopped(call, early, deadlineMs));
    for (;;) {
      let attemptStart = startedAt;
      if (call.attempts > 0) {
        attemptStart = Date.now();
        // A timer may fire a little late: never send an attempt that has no time left.
        if (deadline.remaining(attemptStart) === 0) {
          return this.#giveUp(call, this.#stopped(call, Cut.deadline, deadlineMs));
        }
      }
      const permit = this.breaker ? this.breaker.tryAcquire() : NO_BREAKER;
      if (!permit) {
        const err = new CircuitOpenError({ ...details(call), retryInMs: this.breaker?.retryInMs() ?? 0 });
        return this.#giveUp(call, err);
      }
      const attempt = ++call.attempts;
      const timer = deadline.attempt(perTryMs, attemptStart);
      const body = call.body ?? null;
      const signal = timer.signal ?? null;
      let response: Response | undefined;
      let error: unknown;
      try {
        // Called through a local: a browser's fetch throws "Illegal invocation" when called as a
        // method of another object.
        response = await fetchFn(
          call.url,
          call.init === undefined
            ? { method: call.method, headers, body, signal }
            : { ...call.init, method: call.method, headers, body, signal },
        );
      } catch (err) {
        error = err;
      }
      timer.done();

      if (response && !this.#statuses.has(response.status)) {
        // A final answer, even if the deadline passed meanwhile: it is what happened.
        permit.success();
        if (on.attempt) {
          emit(on.attempt, {
            ...infoOf(call),
            attempt,
            durationMs: Date.now() - attemptStart,
            status: response.status,
            retryable: false,
          });
        }
        const finished = this.#finish(call, response.status);
        if (finished) await finished;
        if (on.done) {
          emit(on.done, {
            ...infoOf(call),
            attempts: attempt,
            status: response.status,
            durationMs: Date.now() - startedAt,
          });
        }
        return response;
      }
      const cut = timer.cut() ?? deadline.stopped();
      if (cut === Cut.caller || cut === Cut.deadline) {
        permit.release(); // cut short on our side: says nothing about the server
        if (response) {
          call.lastResponse = response; // a retryable answer that came in just as time ran out
          call.lastError = undefined;
        }
        return this.#giveUp(call, this.#stopped(call, cut, deadlineMs));
      }
      if (response && !this.breaker?.failureStatuses.has(response.status)) permit.success();
      else permit.failure(); // network error, per-try timeout, or a 5xx
      if (on.attempt) {
        emit(on.attempt, {
          ...infoOf(call),
          attempt,
          durationMs: Date.now() - attemptStart,
          ...(response ? { status: response.status } : { error }),
          retryable: true,
        });
      }
      call.lastResponse = response;
      call.lastError = response ? undefined : error;

      if (attempt >= maxAttempts) {
        return this.#giveUp(call, new AttemptsExhaustedError(details(call)));
      }
      const hint = response ? retryAfterFrom(response) : undefined;
      const delayMs = hint ?? fullJitterMs(attempt, this.#retry, this.#retry.random ?? Math.random);
      if (delayMs > deadline.remaining()) {
        const err = new DeadlineExceededError({
          ...details(call),
          reason: DeadlineReason.waitTooLong,
          waitMs: delayMs,
          deadlineMs,
        });
        return this.#giveUp(call, err);
      }
      if (this.budget && !this.budget.tryRetry()) {
        return this.#giveUp(call, new RetryBudgetExhaustedError(details(call)));
      }
      // The failed attempt's body is not needed: release its connection now.
      if (response) {
        await response.body?.cancel().catch(() => {});
        call.lastResponse = withoutBody(response);
      }
      if (on.wait) {
        emit(on.wait, {
          ...infoOf(call),
          attempt,
          delayMs,
          source: hint !== undefined ? "retry-after" : "backoff",
          ...(response ? { status: response.status } : { error }),
        });
      }
      try {
        await deadline.sleep(delayMs);
      } catch {
        return this.#giveUp(call, this.#stopped(call, Cut.caller, deadlineMs));
      }
    }
  }

  /** The error for a call stopped by its caller or its deadline. */
  #stopped(call: Call, cut: Cut, deadlineMs: number): GiveUpError {
    return cut === Cut.caller
      ? new CallAbortedError({ ...details(call), reason: call.options.signal?.reason })
      : new DeadlineExceededError({ ...details(call), reason: DeadlineReason.elapsed, deadlineMs });
  }

  /**
   * A final answer: a named intent is kept as done (so beginning it again returns its key, and a
   * repeat is replayed rather than charged again); an intent without a name of its own (its id is
   * its key, as for `post()` without an intent) is deleted, since nothing can look it up again and
   * stores must not grow with every call. Returns the store's promise (undefined when there is no
   * intent), for the caller to await without an extra async function.
   */
  #finish(call: Call, status: number): Promise<void> | undefined {
    const record = call.record;
    if (!record) return undefined;
    if (record.id === record.key) return this.store.delete(record.id);
    record.status = IntentStatus.done;
    record.outcome = { status };
    record.attempts += call.attempts;
    record.updatedAt = isoNow();
    return this.store.save(record);
  }

  /** Record the attempts (the intent stays pending), report, then throw or return the last response. */
  async #giveUp(call: Call, error: GiveUpError): Promise<Response> {
    const record = call.record;
    const attempts = call.attempts;
    if (record && attempts > 0) {
      record.attempts += attempts;
      record.updatedAt = isoNow();
      await this.store.save(record);
    }
    const last = error.lastResponse;
    // Only a response whose body is still there is handed back as the answer; one whose body was
    // discarded before a wait (deadline, abort or open circuit during a later step) only informs.
    if (last?.body && this.#giveUpWithResponse && !(error instanceof CallAbortedError)) {
      emit(this.#on.giveUp, { ...infoOf(call), attempts, error });
      return last;
    }
    if (last?.body && !last.bodyUsed) {
      // Read the body into memory so the error can be inspected later without pinning a connection.
      Object.defineProperty(error, "lastResponse", { value: await buffer(last), enumerable: true });
    }
    emit(this.#on.giveUp, { ...infoOf(call), attempts, error });
    throw error;
  }
}

/** What a give-up error says about the call so far. */
function details(call: Call): GiveUpDetails {
  const d: GiveUpDetails = { intentId: call.intentId ?? "", key: call.key ?? "", attempts: call.attempts };
  if (call.lastResponse) d.lastResponse = call.lastResponse;
  if (call.lastError !== undefined) d.lastError = call.lastError;
  return d;
}

/** What every hook event says about the call (built only when a hook is called). */
function infoOf(call: Call): CallInfo {
  const info: CallInfo = { method: call.method, url: call.url };
  if (call.intentId !== undefined) info.intentId = call.intentId;
  if (call.key !== undefined) info.key = call.key;
  return info;
}

function methodOf(init: RequestOptions): string {
  return (init.method ?? "GET").toUpperCase();
}

/** The call's own settings, copied (a caller may reuse its init object while the call runs). */
function callOptions(init: CallOptions): CallOptions {
  const { deadlineMs, perTryTimeoutMs, maxAttempts, signal } = init;
  if (deadlineMs === undefined && perTryTimeoutMs === undefined && maxAttempts === undefined && !signal) {
    return NO_OPTIONS;
  }
  return { deadlineMs, perTryTimeoutMs, maxAttempts, signal };
}

/** The init fields passed on to fetch as they are (undefined when there are none, as usual). */
function fetchFields(init: RequestOptions, ownFields: ReadonlySet<string>): RequestInit | undefined {
  let fields: Record<string, unknown> | undefined;
  for (const name in init) {
    if (!ownFields.has(name) && Object.hasOwn(init, name)) {
      fields ??= {};
      fields[name] = (init as Record<string, unknown>)[name];
    }
  }
  return fields;
}

/** Awaiting a plain value still costs a microtask turn; the success path avoids it. */
function isPromise<T>(value: T | Promise<T>): value is Promise<T> {
  return value instanceof Promise;
}

/** Headers as a plain object with lower-cased names (cheaper for fetch than a Headers object). */
function toHeaderMap(init: HeadersInit | readonly (readonly [string, string])[] | undefined): HeaderMap {
  const out: HeaderMap = {};
  if (init === undefined) return out;
  if (Array.isArray(init)) {
    for (const [name, value] of init as [string, string][]) {
      const k = name.toLowerCase();
      out[k] = k in out ? `${out[k]}, ${value}` : value;
    }
  } else if (typeof Headers !== "undefined" && init instanceof Headers) {
    init.forEach((value, name) => {
      out[name] = value;
    });
  } else {
    for (const name in init as Record<string, string>) {
      out[name.toLowerCase()] = String((init as Record<string, string>)[name]);
    }
  }
  return out;
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
