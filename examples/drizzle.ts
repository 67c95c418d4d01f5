// idem/drizzle: Hono + Drizzle (node-postgres; drizzle-orm/postgres-js works the same way).
// Run it: DATABASE_URL=postgres://... npx tsx --conditions=source examples/drizzle.ts
import { serve } from "@hono/node-server";
import { count } from "drizzle-orm";
import { drizzle } from "drizzle-orm/node-postgres";
import { integer, pgTable, serial, text } from "drizzle-orm/pg-core";
import { Hono } from "hono";
import { validator } from "hono/validator";
import { fromDrizzle } from "idem/drizzle";
import { idempotency } from "idem/hono";
import { migrate, PostgresStore } from "idem/postgres";
import pg from "pg";
import { DATABASE_URL, PAYMENTS_TABLE, paymentOf, tryTwice } from "./try-twice.ts";

const payments = pgTable("payments", {
  id: serial().primaryKey(),
  account: text().notNull(),
  amountCents: integer("amount_cents").notNull(),
});
const app = new Hono();

// #region snippet
const db = drizzle(new pg.Pool({ connectionString: DATABASE_URL }));
const idemDb = fromDrizzle(db); // idem runs inside Drizzle's transactions
await migrate(idemDb);
const store = await PostgresStore.open(idemDb);

app.post(
  "/payments",
  validator("json", (body, c) => paymentOf(body) ?? c.text("amount_cents: a whole number", 400)),
  idempotency({ store, scope: (c) => c.req.header("x-account") }),
  async (c) => {
    const trx = idemDb.tx(c.var.idempotency.tx); // Drizzle's transaction, typed like db
    const { amount_cents } = c.req.valid("json"); // typed by the validator, from the bytes idem read
    const [payment] = await trx
      .insert(payments)
      .values({ account: c.var.idempotency.scope, amountCents: amount_cents })
      .returning();
    return c.json(payment, 201); // the insert, the key and this reply commit together
  },
);
// #endregion snippet

await idemDb.exec(PAYMENTS_TABLE);
const server = serve({ fetch: app.fetch, port: 0 }, async ({ port }) => {
  await tryTwice(`http://127.0.0.1:${port}/payments`, async () => {
    const [row] = await db.select({ n: count() }).from(payments);
    return row?.n ?? 0;
  });
  server.close();
  await idemDb.close();
});
