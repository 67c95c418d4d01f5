/**
 * `idem/client`: fetch with idempotency keys and careful retries. Browser-safe: nothing reachable
 * from here imports a `node:` module. The Node file store is `idem/client/file`, the PostgreSQL
 * store `idem/client/postgres`.
 */
export {
  answerWithinMs,
  classifyNetworkError,
  defaultRetryPredicate,
  expiresAt,
  IN_FLIGHT_PROBLEM,
  isInFlight,
  isUncertain,
  type NetworkFailure,
  OperationState,
  type RetryPredicate,
  readAnswer,
  type ServerAnswer,
  UNCERTAIN_PROBLEM,
} from "./answer.ts";
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
  DEFAULT_BREAKER_FAILURE_RATE,
  DEFAULT_BREAKER_OPEN_MS,
  DEFAULT_BREAKER_WINDOW,
  DEFAULT_FAILURE_STATUSES,
} from "./breaker.ts";
export { DEFAULT_BUDGET_CAP, DEFAULT_BUDGET_RATIO, RetryBudget, type RetryBudgetOptions } from "./budget.ts";
export { createClient, IdemClient } from "./client.ts";
export * from "./errors.ts";
export type { AttemptEvent, CallInfo, ClientHooks, DoneEvent, GiveUpEvent, WaitEvent } from "./events.ts";
export { type IdempotentFetch, type WithIdempotencyOptions, withIdempotency } from "./fetch-wrapper.ts";
export {
  type IntentAnswer,
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
// The operation lookup (client.status, resume asking first).
export {
  DEFAULT_OPERATIONS_PATH,
  OPERATION_NOT_FOUND,
  OPERATION_REF_HEADER,
  type OperationStatus,
} from "./operations.ts";
export {
  ANSWER_WITHIN_MARGIN_MS,
  type CallOptions,
  type ClientOptions,
  DEFAULT_DEADLINE_MS,
  DEFAULT_KEY_HEADER,
  DEFAULT_KEY_RETENTION_MS,
  DEFAULT_MAX_ATTEMPTS,
  DEFAULT_PER_TRY_TIMEOUT_MS,
  DEFAULT_RETRY_STATUSES,
  type FetchLike,
  type RequestOptions,
  type RetryOptions,
} from "./options.ts";
export { parseRetryAfter, retryAfterFrom } from "./retry-after.ts";
