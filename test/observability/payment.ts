/**
 * The scenario, on real sockets: a payment API (Hono + idem on PostgreSQL) whose first reply
 * is lost after the payment was made, and idem's client, which retries with the same key and gets the
 * saved reply. The handler writes a `payment.succeeded` event into the outbox in the same transaction.
 * Used by the tests of test/observability and by scripts/render-trace.ts (the README's picture).
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { Hono } from "hono";
import { createClient } from "../../src/client/index.ts";
import { type IdempotencyEnv, idempotency } from "../../src/http/hono.ts";
import type { Db } from "../../src/postgres/db.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { PostgresStore } from "../../src/postgres/store.ts";

export interface PaymentApi {
  url: string;
  close(): Promise<void>;
}

/** Serve the payment API; the first reply of each key is computed, saved, then lost (socket destroyed). */
export async function startPaymentApi(db: Db, topic: string): Promise<PaymentApi> {
  await db.exec(
    "CREATE TABLE IF NOT EXISTS otel_payments (id serial PRIMARY KEY, amount_cents int NOT NULL)",
  );
  const store = await PostgresStore.open(db);
  const app = new Hono();
  app.post(
    "/payments",
    idempotency({ store, scope: (c) => c.req.header("x-account") }),
    async (c: import("hono").Context<IdempotencyEnv>) => {
      const { tx, body } = c.var.idempotency;
      const amount = Number((body as { amount_cents?: number }).amount_cents);
      const { rows } = await tx.query<{ id: number }>(
        "INSERT INTO otel_payments (amount_cents) VALUES ($1) RETURNING id",
        [amount],
      );
      const id = rows[0]!.id;
      await writeOutbox(tx, { topic, type: "payment.succeeded", payload: { id, amount_cents: amount } });
      return c.json({ id, status: "succeeded" }, 201);
    },
  );
  const seen = new Set<string>();
  const server: Server = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const headers = new Headers();
    for (const [k, v] of Object.entries(req.headers)) if (typeof v === "string") headers.set(k, v);
    const response = await app.fetch(
      new Request(`http://local${req.url}`, { method: req.method, headers, body: Buffer.concat(chunks) }),
    );
    const key = String(req.headers["idempotency-key"] ?? "");
    if (!seen.has(key)) {
      seen.add(key);
      req.socket.destroy(); // the payment is made and its reply saved; the reply is lost on the way
      return;
    }
    res.writeHead(response.status, Object.fromEntries(response.headers));
    res.end(Buffer.from(await response.arrayBuffer()));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** Pay through idem's client: the first attempt's reply is lost, the second gets the saved reply. */
export async function pay(api: PaymentApi): Promise<Response> {
  const client = createClient({ baseUrl: api.url, retry: { baseMs: 5, capMs: 20 } });
  return client.post(
    "/payments",
    { amount_cents: 4200, currency: "EUR" },
    { headers: { "x-account": "acct_1" } },
  );
}
