/**
 * `idem/webhooks`: inbound webhooks exactly once. A delivery is verified (Standard Webhooks, Stripe,
 * GitHub), its event id goes through the inbox in the transaction of the handler's effect, a redelivery
 * is answered 200 without a second effect, a failing event is parked after `maxAttempts`, and
 * `applyIfNewer` applies an event only if it is newer than the row. Adapters for Web (Next.js), Hono,
 * node:http, Express, Fastify and NestJS, none of which is imported here.
 */
// Types the receiver's signatures name (the inbox, relay and publisher are idem/messaging's).
export type { Db, Tx } from "../core/db.ts";
export type { StoredResponse } from "../core/response.ts";
export type { VersionedUpsert } from "../messaging/versioned-upsert.ts";
export {
  WEBHOOK_HEADERS,
  type WebhookRejection,
  WebhookVerificationError,
} from "../messaging/webhook.ts";
export {
  BODY_PARSED_FIX,
  type FastifyLikeInstance,
  type FastifyLikeReply,
  type FastifyLikeRequest,
  type HonoLikeContext,
  type NodeLikeRequest,
} from "./adapters.ts";
export { isWebhookBodyParsed, WebhookBodyParsedError, WebhookPayloadError } from "./errors.ts";
export { type GithubSchemeOptions, githubScheme } from "./github.ts";
export { WebhookReceiver, webhookReceiver } from "./receiver.ts";
export type { Secrets, VerifiedWebhook, WebhookInput, WebhookScheme } from "./scheme.ts";
export { type StandardWebhooksOptions, standardWebhooksScheme } from "./standard.ts";
export { type StripeSchemeOptions, stripeScheme } from "./stripe.ts";
export type {
  EventUpsert,
  WebhookContext,
  WebhookEvent,
  WebhookHandler,
  WebhookOutcome,
  WebhookReceiverOptions,
} from "./types.ts";
