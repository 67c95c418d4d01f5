// Phases mode in one file: a payment that charges a provider (the simulator from idem/testing) and then
// records it with its receipt event, behind a Hono route, on the embedded PGlite.
// Run it: npx tsx --conditions=source examples/phases.ts
import { PGlite } from "@electric-sql/pglite";
import { serve } from "@hono/node-server";
import { Hono } from "hono";
import { createMiddleware } from "hono/factory";
import { RetryableError } from "idem";
import { idempotentPhases } from "idem/hono";
import { definePhases, fromPglite, jsonResponse, migrate, PostgresStore, writeOutbox } from "idem/postgres";
import { chargeProvider, listCharges, startProvider } from "idem/testing";

const db = fromPglite(await PGlite.create());
await migrate(db);
await db.exec("CREATE TABLE payments (id text PRIMARY KEY, account_id text, amount_cents int)");
const store = await PostgresStore.open(db);
const provider = await startProvider({ port: 0 }); // dedups by Idempotency-Key, as Stripe does

type Payment = { amount_cents: number; currency: string };

/** The body, checked: `{ amount_cents, currency }`, a whole number above 0 and a string; else undefined. */
function paymentOf(value: unknown): Payment | undefined {
  if (typeof value !== "object" || value === null) return undefined;
  if (!("amount_cents" in value) || !("currency" in value)) return undefined;
  const { amount_cents, currency } = value;
  return typeof amount_cents === "number" &&
    Number.isInteger(amount_cents) &&
    amount_cents > 0 &&
    typeof currency === "string"
    ? { amount_cents, currency }
    : undefined;
}
const payments = definePhases<Payment, { chargeId: string }>({
  store,
  name: "payments", // stored with each key; the completer finds the runner by it
  phases: {
    started: {
      // One external call, made idempotent by OUR key passed downstream.
      external: async (ctx) => {
        const r = await chargeProvider(provider.url, {
          amount: ctx.input.amount_cents,
          currency: ctx.input.currency,
          idempotencyKey: ctx.idempotencyKey, // `<scope>:<claim id>`, the same on every retry
          timeoutMs: 3_000, // well under the lease
          signal: ctx.signal, // aborted if this worker loses its lease
        });
        if (r.kind === "declined") return { response: jsonResponse(402, { error: "card declined" }) };
        if (r.kind !== "charged") throw new RetryableError("the provider did not answer");
        return { data: { chargeId: r.charge.id } }; // recorded with the next point, fenced by the lease
      },
      next: "charged",
    },
    charged: {
      // One local transaction: the payment row, its receipt event and the saved answer commit together.
      local: async (ctx, tx) => {
        const id = `pay_${ctx.data.chargeId}`;
        await tx.query("INSERT INTO payments (id, account_id, amount_cents) VALUES ($1, $2, $3)", [
          id,
          ctx.scope,
          ctx.input.amount_cents,
        ]);
        await writeOutbox(tx, { topic: "receipt-email", type: "payment.succeeded", payload: { id } });
        return { response: jsonResponse(201, { id, charge: ctx.data.chargeId }) };
      },
    },
  },
});

// Validation before the route's runner: a bad request is answered without claiming the key.
type Validated = { Variables: { payment: Payment } };
const validate = createMiddleware<Validated>(async (c, next) => {
  const payment = paymentOf(await c.req.json().catch(() => undefined));
  if (!payment) return c.json({ error: "amount_cents: a whole number above 0; currency: a string" }, 400);
  c.set("payment", payment);
  await next();
});

const app = new Hono();
app.post(
  "/v1/payments",
  validate,
  idempotentPhases<Payment, Validated>({
    runner: payments,
    scope: (c) => c.req.header("x-account"), // your authentication's account id
    input: (c) => c.var.payment, // typed by the validation; stored with the key for the completer
  }),
);

const server = serve({ fetch: app.fetch, port: 0 }, async ({ port }) => {
  const key = `order-${crypto.randomUUID()}`; // one payment intent: one key, made once, reused by its retries
  const pay = () =>
    fetch(`http://127.0.0.1:${port}/v1/payments`, {
      method: "POST",
      headers: { "x-account": "acct_1", "idempotency-key": key, "content-type": "application/json" },
      body: JSON.stringify({ amount_cents: 5000, currency: "eur" }),
    });
  const replies: string[] = [];
  for (const attempt of [1, 2]) {
    const r = await pay();
    const text = await r.text();
    replies.push(`${r.status} ${text}`);
    const body: unknown = JSON.parse(text);
    const id = typeof body === "object" && body !== null && "id" in body ? String(body.id) : text;
    console.log(
      `attempt ${attempt}: ${r.status} replayed=${r.headers.get("idempotent-replayed") ?? "false"} ${id}`,
    );
  }
  const charges = await listCharges(provider.url);
  const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM payments");
  console.log(`provider charges: ${charges.length}, payments: ${rows[0]?.n}`);
  if (
    charges.length !== 1 ||
    rows[0]?.n !== 1 ||
    replies[0] !== replies[1] ||
    !replies[0]?.startsWith("201")
  ) {
    console.error(
      "check failed: expected one charge, one payment, and the retry's reply the same as the first",
    );
    process.exitCode = 1;
  }
  server.close();
  await provider.close();
  await db.close();
});
