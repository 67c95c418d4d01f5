/**
 * `idem/client`: fetch with idempotency keys and careful retries. Browser-safe: nothing reachable
 * from here imports a `node:` module. The Node file store is `idem/client/file`, the PostgreSQL
 * store `idem/client/postgres`.
 */
export {
  defaultRetryPredicate,
  type NetworkFailure,
  OperationState,
  type RetryPredicate,
  type ServerAnswer,
} from "./answer.ts";
export type { BackoffOptions } from "./backoff.ts";
export {
  type BreakerPermit,
  type BreakerWindow,
  CircuitBreaker,
  type CircuitBreakerOptions,
  CircuitState,
  DEFAULT_FAILURE_STATUSES,
} from "./breaker.ts";
export { RetryBudget, type RetryBudgetOptions } from "./budget.ts";
export { createClient, IdemClient } from "./client.ts";
export {
  AttemptsExhaustedError,
  CallAbortedError,
  CircuitOpenError,
  ClientErrorCode,
  DeadlineExceededError,
  DeadlineReason,
  type GiveUpDetails,
  GiveUpError,
  IdemClientError,
  IntentConflictError,
  IntentError,
  IntentExpiredError,
  IntentHasNoRequestError,
  IntentNotFoundError,
  isAttemptsExhaustedError,
  isCallAbortedError,
  isCircuitOpenError,
  isDeadlineExceededError,
  isGiveUpError,
  isIdemClientError,
  isIntentConflictError,
  isIntentExpiredError,
  isIntentHasNoRequestError,
  isIntentNotFoundError,
  isNewKeyNotSafeError,
  isOperationUncertainError,
  isRetryBudgetExhaustedError,
  isUnreplayableBodyError,
  NewKeyNotSafeError,
  OperationUncertainError,
  RetryBudgetExhaustedError,
  UnreplayableBodyError,
} from "./errors.ts";
export type { AttemptEvent, CallInfo, ClientHooks, DoneEvent, GiveUpEvent, WaitEvent } from "./events.ts";
export {
  FailedFastError,
  isFailedFastError,
  PASSED_UP_PROBLEM,
  type PassUpOptions,
  passUp,
} from "./fail-fast.ts";
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
  type CallOptions,
  type ClientOptions,
  DEFAULT_RETRY_STATUSES,
  type FetchLike,
  type RequestOptions,
  type RetryOptions,
} from "./options.ts";
