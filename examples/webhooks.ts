// idem/webhooks on Express: Stripe's payment_intent events applied once, newest state wins.
// Run it: npx tsx --conditions=source examples/webhooks.ts   (embedded PGlite; DATABASE_URL for a server)
// The deliveries are signed with the `stripe` package's test helper, as Stripe signs them.
import type { AddressInfo } from "node:net";
import { PGlite } from "@electric-sql/pglite";
import express from "express";
import { fromPg, fromPglite, migrate } from "idem/postgres";
import { stripeScheme, webhookReceiver } from "idem/webhooks";
import pg from "pg";
import Stripe from "stripe";

const db = process.env.DATABASE_URL
  ? fromPg(new pg.Pool({ connectionString: process.env.DATABASE_URL }))
  : fromPglite(await PGlite.create());
await migrate(db);
await db.exec(`CREATE TABLE IF NOT EXISTS payment_intents (
  id text PRIMARY KEY, status text NOT NULL, amount bigint NOT NULL, version timestamptz NOT NULL)`);
const secret = "whsec_example_secret";

// #region snippet
type PaymentIntentEvent = { data: { object: { id: string; status: string; amount: number } } };

const receiver = webhookReceiver<PaymentIntentEvent>({
  db,
  scheme: stripeScheme({ secret }), // secret: [old, new] while you roll it
  handler: async (event, { applyIfNewer }) => {
    const intent = event.payload.data.object;
    // Only if this event is newer than the row (by the event's `created`); an older one is
    // acknowledged and recorded "stale". Runs in the transaction that marks the event id as seen.
    await applyIfNewer({
      table: "payment_intents",
      key: { id: intent.id },
      values: { status: intent.status, amount: intent.amount },
    });
  },
});

const app = express();
app.post("/webhooks/stripe", receiver.express()); // before express.json(): it needs the raw bytes
app.use(express.json()); // the rest of the app
// #endregion snippet

const server = app.listen(0, "127.0.0.1");
await new Promise((ok) => server.once("listening", ok));
const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/webhooks/stripe`;

async function deliver(label: string, event: object, tamper = false): Promise<void> {
  const payload = JSON.stringify(event);
  const header = Stripe.webhooks.generateTestHeaderString({ payload, secret });
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", "stripe-signature": header },
    body: tamper ? payload.replace("5000", "1") : payload,
  });
  const body = (await res.json()) as { result?: string; detail?: string };
  console.log(`${label}: ${res.status} ${body.result ?? body.detail}`);
}

const now = Math.floor(Date.now() / 1000);
const intentEvent = (id: string, status: string, created: number) => ({
  id,
  object: "event",
  type: `payment_intent.${status}`,
  created,
  data: { object: { id: "pi_1", object: "payment_intent", amount: 5000, status } },
});
await deliver("succeeded", intentEvent("evt_2", "succeeded", now));
await deliver("succeeded again (a redelivery)", intentEvent("evt_2", "succeeded", now));
await deliver("processing, late (older than the row)", intentEvent("evt_1", "processing", now - 3));
await deliver("tampered", intentEvent("evt_3", "canceled", now + 1), true);

const { rows } = await db.query<{ id: string; status: string }>("SELECT id, status FROM payment_intents");
console.log(`payment intents: ${rows.map((r) => `${r.id} ${r.status}`).join(", ")}`);
server.close();
await db.close();
