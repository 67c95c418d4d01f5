/**
 * The errors of `idem/webhooks` besides `WebhookVerificationError` (idem/messaging's, shared with the
 * outbound publisher's `verifyWebhook`): each has a `name`, a stable `code` and keeps its `cause`.
 */

/**
 * A body parser ran before the receiver (Express's `json()`, Nest without `rawBody: true`, Fastify's
 * JSON parser, Hono's `c.req.json()`), so the bytes the sender signed are gone. Answered 500 with the
 * fix in the detail, never as a signature mismatch: the sender is not at fault, the server's setup is.
 */
export class WebhookBodyParsedError extends Error {
  /** Always `"WebhookBodyParsedError"`: the name logs and stack traces show. */
  override readonly name = "WebhookBodyParsedError";
  /** Always `"IDEM_WEBHOOK_BODY_PARSED"`: a code to check that does not depend on the class. */
  readonly code = "IDEM_WEBHOOK_BODY_PARSED";
}

/** A delivery whose signature checked out but whose body is not the event the scheme describes. */
export class WebhookPayloadError extends Error {
  /** Always `"WebhookPayloadError"`: the name logs and stack traces show. */
  override readonly name = "WebhookPayloadError";
  /** Always `"IDEM_WEBHOOK_PAYLOAD"`: a code to check that does not depend on the class. */
  readonly code = "IDEM_WEBHOOK_PAYLOAD";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** Whether `err` is a {@link WebhookBodyParsedError} (a body parser ran before the receiver). */
export function isWebhookBodyParsed(err: unknown): err is WebhookBodyParsedError {
  return err instanceof WebhookBodyParsedError;
}
