/**
 * The client's options, their defaults, and the settings resolved from them once per client.
 *
 * Timing defaults follow idem's timing contract (docs/contract.md): a server answers a keyed request
 * within its answer bound (5 s by default, published as `Idempotency-Answer-Within`), so one try gets
 * 10 s (the bound plus a margin) and a whole call 30 s (room for a few tries and waits).
 */

import { defaultRetryPredicate, type RetryPredicate } from "./answer.ts";
import type { BackoffOptions } from "./backoff.ts";
import { CircuitBreaker, type CircuitBreakerOptions } from "./breaker.ts";
import { RetryBudget, type RetryBudgetOptions } from "./budget.ts";
import type { ClientHooks } from "./events.ts";
import { type HeaderMap, toHeaderMap } from "./headers.ts";
import { type IntentStore, MemoryIntentStore } from "./intent-store.ts";
import { DEFAULT_OPERATIONS_PATH } from "./operations.ts";

/** What the client needs from `fetch`. The global `fetch` fits, and so do most wrappers of it. */
export type FetchLike = (url: string, init: RequestInit) => Promise<Response>;

/** Retried when the server gives no `retry_same_key`. 409 is not here: see {@link RetryOptions.statuses}. */
export const DEFAULT_RETRY_STATUSES: readonly number[] = [408, 429, 500, 502, 503, 504];
export const DEFAULT_MAX_ATTEMPTS = 5;
export const DEFAULT_DEADLINE_MS = 30_000;
export const DEFAULT_PER_TRY_TIMEOUT_MS = 10_000;
/** Added to a server's `Idempotency-Answer-Within` to get the per-try timeout of later attempts. */
export const ANSWER_WITHIN_MARGIN_MS = 2_000;
/** How long a key is assumed to live on the server when no answer said (idem's default retention). */
export const DEFAULT_KEY_RETENTION_MS = 24 * 60 * 60 * 1000;
export const DEFAULT_KEY_HEADER = "Idempotency-Key";

/**
 * Which outcomes are retried and how long to wait between them. (How many attempts a call makes is
 * `maxAttempts`, beside `deadlineMs` and `perTryTimeoutMs`: the same name for the client and for a call.)
 */
export interface RetryOptions extends BackoffOptions {
  /**
   * Statuses retried when the server does not say (no `retry_same_key` in a problem body). Default
   * 408, 429, 500, 502, 503, 504. A 409 is retried only when the server says the key is in flight
   * (problem type `urn:idem:problem:idempotency-key-in-flight`, or the header
   * `Idempotency-Operation-State: in_progress`); every other 409 is a business conflict and is
   * returned at once. Add 409 here only for a server that uses it for nothing but "in progress".
   */
  statuses?: readonly number[];
  /**
   * Decides whether a response that is not a 2xx/3xx is retried with the same key. Default
   * {@link defaultRetryPredicate}: the server's `retry_same_key` when present, else in-flight 409s and
   * `statuses`. An `uncertain` operation is never retried, whatever this returns; network errors and
   * per-try timeouts are always retried (their outcome is unknown).
   */
  shouldRetry?: RetryPredicate;
  /** Random numbers in [0, 1) for the jitter. Default `Math.random`. */
  random?: () => number;
}

/** Options of `createClient`. Every one is optional. */
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
  /**
   * Most attempts per call, the first included. Default 5, counting the attempts that reached a server
   * (one refused before anything was sent, e.g. while the service restarts, is bounded by the deadline,
   * the budget and the breaker instead); a limit set here counts every attempt.
   */
  maxAttempts?: number;
  /** Time for a whole call: every attempt and every wait. Default 30,000 ms. */
  deadlineMs?: number;
  /**
   * Time for one attempt, until its response headers arrive. Default 10,000 ms. When a response
   * carries `Idempotency-Answer-Within: N`, later attempts of that call get at least N s + 2 s
   * (never past the deadline). (Reading a final response's body is not timed by the client.)
   */
  perTryTimeoutMs?: number;
  /**
   * How long the server keeps a key, for intents no answer gave an `Idempotency-Expires`: such an
   * intent is taken as expired this long after it was created. Default 24 h (idem's default
   * retention); `Infinity` turns the fallback off.
   */
  keyRetentionMs?: number;
  /**
   * Retry budget shared by every call of this client (pass one {@link RetryBudget} to several
   * clients to share it wider), or `false` for none. Default `new RetryBudget()`: ratio 0.1, cap 10.
   */
  budget?: RetryBudget | RetryBudgetOptions | false;
  /**
   * Circuit breaker consulted before every attempt (pass one {@link CircuitBreaker} to several
   * clients to share it), or `false` for none. Default `new CircuitBreaker()`: opens when more than
   * half of the last 10 s of attempts failed, at least 10 of them; probes after 5 s.
   */
  breaker?: CircuitBreaker | CircuitBreakerOptions | false;
  /**
   * For a layer that is not the one that retries (a gateway, a service between the user's app and the
   * dependency): each call makes ONE attempt, waits for nothing and spends no retry budget; a failure a
   * retry could fix is thrown at once as `FailedFastError`, which `passUp(error)` turns into the answer
   * the outer layer needs to retry well (`retry_same_key`, `Retry-After`, the operation's state). The
   * breaker still applies. Default false.
   */
  failFast?: boolean;
  /** Hooks for logging and metrics. Default: none. */
  on?: ClientHooks;
  /**
   * What a call that gave up after receiving a response does: `"error"` throws the typed error
   * (with `lastResponse`, body buffered); `"response"` returns that last response as `fetch` would.
   * Calls that got no response always throw, and so does an uncertain operation.
   * Default `"error"` (`"response"` in `withIdempotency`).
   */
  giveUpWith?: "error" | "response";
  /**
   * Where the server's operation lookup is (idem's `GET /v1/operations/{ref}`), resolved against each
   * request's URL; `false`: never ask. `client.status(intent)` asks it; `client.resume(intent)` asks it
   * before sending the request again when the server offers it (an answer carried
   * `Idempotency-Operation-Ref`) or when this option is set. Default: `/v1/operations`.
   */
  operationsPath?: string | false;
}

/** Per-call settings, on top of the usual `fetch` init. */
export interface CallOptions {
  /** This call's deadline. Default: the client's `deadlineMs`. */
  deadlineMs?: number;
  /** This call's per-try timeout. Default: the client's `perTryTimeoutMs`. */
  perTryTimeoutMs?: number;
  /** This call's attempt limit (every attempt counts). Default: the client's `maxAttempts`. */
  maxAttempts?: number;
  /** Cancels the call at once, including a wait between attempts. */
  signal?: AbortSignal | null;
}

/** A call's options: the usual `fetch` init (its `signal` too) and the per-call settings. */
export type RequestOptions = Omit<RequestInit, "signal"> & CallOptions;

/** The options, resolved once per client: what the attempt loop reads on every call. */
export class Settings {
  readonly fetch: FetchLike | undefined;
  /** The key header's name, lower-cased. */
  readonly keyHeader: string;
  readonly quoteKey: boolean;
  readonly headers: HeaderMap | (() => HeadersInit | Promise<HeadersInit>) | undefined;
  readonly retry: RetryOptions;
  readonly shouldRetry: RetryPredicate;
  readonly maxAttempts: number;
  /** Whether `maxAttempts` was given (then every attempt counts, those that reached no server too). */
  readonly maxAttemptsSet: boolean;
  readonly deadlineMs: number;
  readonly perTryMs: number;
  readonly keyRetentionMs: number;
  readonly budget: RetryBudget | undefined;
  readonly breaker: CircuitBreaker | undefined;
  readonly on: ClientHooks;
  readonly giveUpWithResponse: boolean;
  readonly failFast: boolean;
  readonly random: () => number;
  /** The lookup's path (`ClientOptions.operationsPath`), or false; `operationsSet`: given explicitly. */
  readonly operationsPath: string | false;
  readonly operationsSet: boolean;

  constructor(options: ClientOptions) {
    this.fetch = options.fetch;
    this.keyHeader = (options.keyHeader ?? DEFAULT_KEY_HEADER).toLowerCase();
    this.quoteKey = options.keyFormat === "sf-string";
    const h = options.headers;
    this.headers = typeof h === "function" ? h : h === undefined ? undefined : toHeaderMap(h);
    this.retry = options.retry ?? {};
    this.shouldRetry =
      this.retry.shouldRetry ?? defaultRetryPredicate(new Set(this.retry.statuses ?? DEFAULT_RETRY_STATUSES));
    this.maxAttempts = options.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
    this.maxAttemptsSet = options.maxAttempts !== undefined;
    this.deadlineMs = options.deadlineMs ?? DEFAULT_DEADLINE_MS;
    this.perTryMs = options.perTryTimeoutMs ?? DEFAULT_PER_TRY_TIMEOUT_MS;
    this.keyRetentionMs = options.keyRetentionMs ?? DEFAULT_KEY_RETENTION_MS;
    this.random = this.retry.random ?? Math.random;
    this.failFast = options.failFast === true;
    this.budget = this.failFast ? undefined : own(options.budget, RetryBudget);
    this.breaker = own(options.breaker, CircuitBreaker);
    this.on = options.on ?? {};
    this.giveUpWithResponse = options.giveUpWith === "response";
    this.operationsPath = options.operationsPath ?? DEFAULT_OPERATIONS_PATH;
    this.operationsSet = options.operationsPath !== undefined;
  }
}

/** A shared instance as given, `false` as none, options (or nothing) as a new instance. */
function own<T, O>(given: T | O | false | undefined, Kind: new (options?: O) => T): T | undefined {
  if (given === false) return undefined;
  return given instanceof Kind ? given : new Kind(given as O | undefined);
}

export function defaultStore(options: ClientOptions): IntentStore {
  return options.store ?? new MemoryIntentStore();
}
