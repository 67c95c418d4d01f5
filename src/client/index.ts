/**
 * `idem/client`: fetch with idempotency keys and careful retries. Browser-safe: nothing reachable
 * from here imports a `node:` module. The Node file store is `idem/client/file`, the PostgreSQL
 * store `idem/client/postgres`.
 */
export {
  type BackoffOptions,
  backoffCeilingMs,
  DEFAULT_BACKOFF_BASE_MS,
  DEFAULT_BACKOFF_CAP_MS,
  fullJitterMs,
} from "./backoff.ts";
export {
  type BreakerPermit,
  type BreakerWindow,
  CircuitBreaker,
  type CircuitBreakerOptions,
  CircuitState,
  DEFAULT_BREAKER_CONSECUTIVE_FAILURES,
  DEFAULT_BREAKER_OPEN_MS,
  DEFAULT_FAILURE_STATUSES,
} from "./breaker.ts";
export { DEFAULT_BUDGET_CAP, DEFAULT_BUDGET_RATIO, RetryBudget, type RetryBudgetOptions } from "./budget.ts";
export {
  type CallOptions,
  type ClientOptions,
  createClient,
  DEFAULT_DEADLINE_MS,
  DEFAULT_KEY_HEADER,
  DEFAULT_MAX_ATTEMPTS,
  DEFAULT_PER_TRY_TIMEOUT_MS,
  DEFAULT_RETRY_STATUSES,
  type FetchLike,
  IdemClient,
  type RequestOptions,
  type RetryOptions,
} from "./client.ts";
export * from "./errors.ts";
export type { AttemptEvent, CallInfo, ClientHooks, DoneEvent, GiveUpEvent, WaitEvent } from "./events.ts";
export { type IdempotentFetch, type WithIdempotencyOptions, withIdempotency } from "./fetch-wrapper.ts";
export {
  type IntentRecord,
  type IntentRef,
  IntentStatus,
  type IntentStore,
  MemoryIntentStore,
  newIntentRecord,
  type StoredRequest,
} from "./intent-store.ts";
export { newIdempotencyKey } from "./key.ts";
export {
  LocalStorageIntentStore,
  type LocalStorageIntentStoreOptions,
  type StorageLike,
} from "./local-storage-store.ts";
export { parseRetryAfter, retryAfterFrom } from "./retry-after.ts";
