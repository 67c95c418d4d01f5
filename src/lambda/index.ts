/**
 * `idem/lambda`: AWS Lambda handlers. HTTP events (API Gateway REST and HTTP APIs, Function URLs, ALB)
 * go through the one request lifecycle every adapter uses; SQS batches go through the inbox. See
 * docs/serverless.md.
 */

export { SQS_MESSAGE_ID_ATTRIBUTE, type SqsRecordLike } from "../messaging/sqs-delivery.ts";
export { DEFAULT_RESERVE_MS, type LambdaContextLike } from "./deadline.ts";
export type {
  AlbEvent,
  HttpApiEvent,
  LambdaHttpEvent,
  LambdaReply,
  ProxyResult,
  ProxyResultV2,
  RestApiEvent,
} from "./events.ts";
export {
  idempotency,
  idempotentPhases,
  type LambdaHttpHandler,
  type LambdaIdempotencyContext,
  type LambdaIdempotencyOptions,
  type LambdaIdempotentHandler,
  type LambdaPhasesOptions,
  type LambdaRouteOptions,
} from "./http.ts";
export {
  type SqsBatchOptions,
  type SqsBatchResult,
  type SqsEventLike,
  type SqsRecordHandler,
  sqsBatch,
} from "./sqs.ts";
