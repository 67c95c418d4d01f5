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
