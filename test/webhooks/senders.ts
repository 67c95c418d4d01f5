/**
 * The other side of the webhook tests: deliveries signed by the providers' own libraries (`stripe`'s
 * test header helper, `standardwebhooks`' `sign`, `@octokit/webhooks-methods`' `sign`), never by idem's
 * code. Ed25519 (`v1a`) is signed with node:crypto as the Standard Webhooks spec writes it, since the
 * `standardwebhooks` package signs only `v1`.
 */
import { sign as edSign, generateKeyPairSync, randomBytes } from "node:crypto";
import { sign as githubSign } from "@octokit/webhooks-methods";
import { Webhook } from "standardwebhooks";
import Stripe from "stripe";
import { afterAll, beforeAll } from "vitest";
import type { Db, Tx } from "../../src/postgres/db.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import type { TestBackend } from "../helpers/db.ts";

/** A delivery as a sender makes it: headers and the body's exact text. */
export interface Delivery {
  headers: Record<string, string>;
  body: string;
}

export const STRIPE_SECRET = "whsec_test_stripe_0123456789abcdef";
export const STANDARD_SECRET = `whsec_${randomBytes(24).toString("base64")}`;
export const GITHUB_SECRET = "it's a secret to everybody";

/** A Stripe event (as Stripe sends it) for a payment intent in `status`, created at `created`. */
export function paymentIntentEvent(
  eventId: string,
  intentId: string,
  status: string,
  created: number,
  amount = 5000,
): Record<string, unknown> {
  return {
    id: eventId,
    object: "event",
    api_version: "2024-06-20",
    created,
    type: `payment_intent.${status}`,
    data: { object: { id: intentId, object: "payment_intent", amount, currency: "eur", status } },
  };
}

/** Signed with `stripe`'s `generateTestHeaderString` (at `timestamp`, Unix seconds, default now). */
export function stripeDelivery(
  event: Record<string, unknown> | string,
  options: { secret?: string; timestamp?: number } = {},
): Delivery {
  const body = typeof event === "string" ? event : JSON.stringify(event);
  const header = Stripe.webhooks.generateTestHeaderString({
    payload: body,
    secret: options.secret ?? STRIPE_SECRET,
    timestamp: options.timestamp,
  });
  return { headers: { "content-type": "application/json", "stripe-signature": header }, body };
}

/** Signed with `standardwebhooks`' `Webhook.sign` (at `at`, default now). */
export function standardDelivery(
  id: string,
  payload: Record<string, unknown>,
  options: { secret?: string; at?: Date } = {},
): Delivery {
  const body = JSON.stringify(payload);
  const at = options.at ?? new Date();
  const signature = new Webhook(options.secret ?? STANDARD_SECRET).sign(id, at, body);
  return {
    headers: {
      "content-type": "application/json",
      "webhook-id": id,
      "webhook-timestamp": String(Math.floor(at.getTime() / 1000)),
      "webhook-signature": signature,
    },
    body,
  };
}

/** An Ed25519 key pair in the Standard Webhooks formats: `whpk_` public key, and a signer of `v1a`. */
export function ed25519Signer(): { publicKey: string; sign(id: string, ts: number, body: string): string } {
  const { publicKey, privateKey } = generateKeyPairSync("ed25519");
  const raw = Buffer.from(publicKey.export({ format: "jwk" }).x!, "base64url");
  return {
    publicKey: `whpk_${raw.toString("base64")}`,
    sign: (id, ts, body) =>
      `v1a,${edSign(null, Buffer.from(`${id}.${ts}.${body}`), privateKey).toString("base64")}`,
  };
}

/** Signed with `@octokit/webhooks-methods`' `sign`. */
export async function githubDelivery(
  deliveryId: string,
  event: string,
  payload: Record<string, unknown>,
  secret = GITHUB_SECRET,
): Promise<Delivery> {
  const body = JSON.stringify(payload);
  return {
    headers: {
      "content-type": "application/json",
      "x-github-delivery": deliveryId,
      "x-github-event": event,
      "x-hub-signature-256": await githubSign(secret, body),
    },
    body,
  };
}

/** idem's schema, a payment intents table the handlers keep, and a log of every applied effect. */
export async function prepareWebhookDb(db: Db): Promise<void> {
  await migrate(db);
  await db.exec(`
    CREATE TABLE IF NOT EXISTS intents (
      id text PRIMARY KEY, status text NOT NULL, amount bigint NOT NULL, version timestamptz NOT NULL);
    CREATE TABLE IF NOT EXISTS effects (
      consumer text NOT NULL, event_id text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
  `);
}

/** A database of `backend` for the file's tests, prepared once: `db()` inside a test. */
export function useWebhookDb(backend: TestBackend): () => Db {
  let open: Awaited<ReturnType<TestBackend["open"]>> | undefined;
  beforeAll(async () => {
    open = await backend.open();
    await prepareWebhookDb(open.db);
  });
  afterAll(() => open?.close());
  return () => open!.db;
}

/** The effect the tests count: one row per application of an event for `consumer`. */
export async function logEffect(tx: Tx, consumer: string, eventId: string): Promise<void> {
  await tx.query("INSERT INTO effects (consumer, event_id) VALUES ($1, $2)", [consumer, eventId]);
}

/** How many times each event's effect was applied for `consumer` (the count users care about). */
export async function effectCount(db: Db, consumer: string, eventId?: string): Promise<number> {
  const { rows } = await db.query<{ n: string }>(
    "SELECT count(*) AS n FROM effects WHERE consumer = $1 AND ($2::text IS NULL OR event_id = $2)",
    [consumer, eventId ?? null],
  );
  return Number(rows[0]!.n);
}

/** Send a delivery to a Web-style handler (what every adapter test ends up doing over HTTP). */
export function request(url: string, d: Delivery, init: { headers?: Record<string, string> } = {}): Request {
  return new Request(url, { method: "POST", headers: { ...d.headers, ...init.headers }, body: d.body });
}
