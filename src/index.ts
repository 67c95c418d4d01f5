/**
 * `idem`: the protocol's public names, shared by every adapter: the errors idem throws, the key rule,
 * the problem answers and their operation fields, outcomes, the store contract and sealing.
 *
 * A curated list: each name here is a promise kept across minor releases. Adapters, the store and the
 * client import the core's other parts by relative path (src/core/index.ts), not from here.
 */
export { bodyKind } from "./core/body.ts";
export { downstreamKey } from "./core/claim-id.ts";
export {
  AbandonedWorkError,
  IdemError,
  isIdemError,
  KeyInFlightError,
  KeyInvalidError,
  KeyMismatchError,
  KeyMissingError,
  LeaseLostError,
  OperationUncertainError,
  ProblemCode,
  RetryableError,
} from "./core/errors.ts";
export { TransactionEndedError } from "./core/guarded-tx.ts";
export {
  formatIdempotencyKey,
  IDEMPOTENCY_KEY_PATTERN,
  MAX_KEY_LENGTH,
  parseIdempotencyKey,
} from "./core/key.ts";
export {
  type DecodedOperationRef,
  type OperationRefCodec,
  OperationRefs,
} from "./core/operation-ref.ts";
export { IdemOptionsError } from "./core/options.ts";
export { Outcome, type OutcomeEvent } from "./core/outcome.ts";
export {
  FAILED_NOT_APPLIED,
  NOTHING_DONE,
  type OperationFields,
  type OperationState,
  OUTCOME_UNKNOWN_RETRY,
  type ProblemDetails,
  problemResponse,
} from "./core/problem.ts";
export { DamagedReplyError, type StoredResponse } from "./core/response.ts";
export { AesGcmSealer, type Sealer, type SealingKey, sealerFromEnv } from "./core/sealing.ts";
export { isConnectFailure, isDatabaseUnavailable } from "./core/sqlstate.ts";
export type { AtomicStore } from "./core/store.ts";
