/**
 * The payment provider's webhooks: `POST /v1/webhooks/provider` takes the provider's charge events
 * (Stripe's signature scheme) exactly once, through idem's inbox, and keeps `provider_charges` in step
 * with the provider: a charge's newest state wins whatever order its events arrive in (each carries
 * the charge's `version`), a redelivery changes nothing, and an older event is acknowledged and
 * recorded stale. The in-process simulator sends these with duplicates, delays and reordering on purpose.
 */
import type { Hono } from "hono";
import type { Db } from "idem/postgres";
import { stripeScheme, type WebhookReceiver, webhookReceiver } from "idem/webhooks";
import type { Logger } from "pino";
import { type Json, jsonReply, problemReply } from "./openapi-parts.ts";

export const PROVIDER_WEBHOOK_PATH = "/v1/webhooks/provider";

/** The table the provider's events keep (made by app/database.ts's `prepareSchema`). */
export const PROVIDER_WEBHOOK_TABLES = `
  CREATE TABLE IF NOT EXISTS provider_charges (
    id         text PRIMARY KEY,           -- the provider's charge id (ch_...)
    amount     bigint NOT NULL,
    currency   text NOT NULL,
    status     text NOT NULL,              -- pending, succeeded, failed
    reference  text,                       -- our own reference, when the charge carried one
    version    bigint NOT NULL,            -- the provider's version of the charge: the newest wins
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
  );
`;

/** A charge event as the provider sends it. */
interface ChargeEvent {
  data: {
    object: {
      id: string;
      amount: number;
      currency: string;
      status: string;
      reference: string | null;
      version: number;
    };
  };
}

/** The receiver of the provider's charge events. */
export function providerWebhookReceiver(deps: {
  db: Db;
  secret: string;
  logger?: Logger;
}): WebhookReceiver<ChargeEvent> {
  return webhookReceiver<ChargeEvent>({
    db: deps.db,
    consumer: "provider-charges",
    scheme: stripeScheme({ secret: deps.secret }),
    onError: (err, event) => deps.logger?.error({ err, event: event?.id }, "provider webhook failed"),
    handler: async (event, { applyIfNewer }) => {
      const charge = event.payload.data.object;
      await applyIfNewer({
        table: "provider_charges",
        key: { id: charge.id },
        version: charge.version,
        values: {
          amount: charge.amount,
          currency: charge.currency,
          status: charge.status,
          reference: charge.reference,
        },
      });
    },
  });
}

/** Mount `POST /v1/webhooks/provider` on `app`. */
export function providerWebhookRoutes(app: Hono, deps: { db: Db; secret: string; logger?: Logger }): void {
  app.post(PROVIDER_WEBHOOK_PATH, providerWebhookReceiver(deps).hono());
}

/** The route in the OpenAPI document (app/openapi.ts), when the service takes the provider's webhooks. */
export function providerWebhookPaths(): Json {
  const received = {
    type: "object",
    required: ["received", "id", "result"],
    properties: {
      received: { const: true },
      id: { type: "string", description: "The provider's event id (what the inbox deduplicates on)." },
      result: { enum: ["applied", "stale", "duplicate", "parked"] },
    },
  };
  return {
    [PROVIDER_WEBHOOK_PATH]: {
      post: {
        operationId: "providerWebhook",
        summary: "The payment provider's charge events (Stripe's signature scheme), applied once each",
        description:
          "Signed with `Stripe-Signature` over the raw body. Each event id is marked in the transaction that applies it; a redelivery is answered 200 `duplicate`, an event older than the charge's stored version 200 `stale`.",
        security: [],
        parameters: [{ name: "Stripe-Signature", in: "header", required: true, schema: { type: "string" } }],
        requestBody: { required: true, content: { "application/json": { schema: { type: "object" } } } },
        responses: {
          "200": jsonReply(
            "The event is applied, or was before, or is older than what the service holds.",
            received,
          ),
          "400": problemReply("A signature header missing or malformed, or a body that is not an event.", [
            "webhook-missing-header",
            "webhook-malformed",
            "webhook-payload",
          ]),
          "401": problemReply("No signature matches, or the signed time is too far from now.", [
            "webhook-signature",
            "webhook-timestamp",
          ]),
          "500": problemReply(
            "The event could not be applied now; nothing was. The provider delivers it again.",
            ["webhook-handler-failed"],
          ),
          "503": problemReply("The database does not answer.", ["database-unavailable"]),
        },
        "x-idempotency": {
          required: false,
          retentionSeconds: null,
          replayHeader: null,
          answerWithinSeconds: null,
          deduplicatedBy: "the event's id, in the inbox",
        },
      },
    },
  };
}
