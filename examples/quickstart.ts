// A keyed payment endpoint in one file: Hono + idem on the embedded PGlite.
// Run it: npx tsx --conditions=source examples/quickstart.ts
import { PGlite } from "@electric-sql/pglite";
import { serve } from "@hono/node-server";
import { Hono } from "hono";
import { idempotency } from "idem/hono";
import { fromPglite, migrate, PostgresStore } from "idem/postgres";

const db = fromPglite(await PGlite.create()); // or fromPg(new pg.Pool(...)), fromPostgresJs(postgres(...))
await migrate(db);
await db.exec("CREATE TABLE charges (id serial PRIMARY KEY, account text, amount_cents int)");
const store = await PostgresStore.open(db); // keys kept 24 h by default

const app = new Hono();
app.post(
  "/charges",
  idempotency({ store, scope: (c) => c.req.header("x-account") }), // scope = the authenticated caller
  async (c) => {
    const { amount_cents } = await c.req.json();
    // Runs in the key's transaction: the charge and the saved reply commit together, or neither does.
    const { rows } = await c.var.idempotency.tx.query(
      "INSERT INTO charges (account, amount_cents) VALUES ($1, $2) RETURNING id, amount_cents",
      [c.req.header("x-account"), amount_cents],
    );
    return c.json(rows[0], 201);
  },
);

const server = serve({ fetch: app.fetch, port: 0 }, async ({ port }) => {
  const send = () =>
    fetch(`http://127.0.0.1:${port}/charges`, {
      method: "POST",
      headers: {
        "x-account": "acct_1",
        "idempotency-key": "order-42-payment",
        "content-type": "application/json",
      },
      body: JSON.stringify({ amount_cents: 5000 }),
    });
  for (const attempt of [1, 2]) {
    const r = await send();
    console.log(
      `attempt ${attempt}: ${r.status} replayed=${r.headers.get("idempotent-replayed") ?? "false"} ${await r.text()}`,
    );
  }
  const { rows } = await db.query("SELECT count(*)::int AS n FROM charges");
  console.log(`charges in the table: ${rows[0]?.n}`);
  server.close();
  await db.close();
});
