// idem/kysely: Hono + Kysely (PostgresDialect on node-postgres).
// Run it: DATABASE_URL=postgres://... npx tsx --conditions=source examples/kysely.ts
import { serve } from "@hono/node-server";
import { Hono } from "hono";
import { validator } from "hono/validator";
import { idempotency } from "idem/hono";
import { fromKysely } from "idem/kysely";
import { migrate, PostgresStore } from "idem/postgres";
import { type Generated, Kysely, PostgresDialect } from "kysely";
import pg from "pg";
import { DATABASE_URL, PAYMENTS_TABLE, paymentOf, tryTwice } from "./try-twice.ts";

interface Database {
  payments: { id: Generated<number>; account: string; amount_cents: number };
}
const app = new Hono();

// #region snippet
const db = new Kysely<Database>({
  dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: DATABASE_URL }) }),
});
const idemDb = fromKysely(db); // idem runs inside Kysely's transactions
await migrate(idemDb);
const store = await PostgresStore.open(idemDb);

app.post(
  "/payments",
  validator("json", (body, c) => paymentOf(body) ?? c.text("amount_cents: a whole number", 400)),
  idempotency({ store, scope: (c) => c.req.header("x-account") }),
  async (c) => {
    const trx = idemDb.tx(c.var.idempotency.tx); // Transaction<Database>
    const { amount_cents } = c.req.valid("json"); // typed by the validator, from the bytes idem read
    const payment = await trx
      .insertInto("payments")
      .values({ account: c.var.idempotency.scope, amount_cents })
      .returningAll()
      .executeTakeFirstOrThrow();
    return c.json(payment, 201); // the insert, the key and this reply commit together
  },
);
// #endregion snippet

await idemDb.exec(PAYMENTS_TABLE);
const server = serve({ fetch: app.fetch, port: 0 }, async ({ port }) => {
  await tryTwice(`http://127.0.0.1:${port}/payments`, async () => {
    const row = await db
      .selectFrom("payments")
      .select((e) => e.fn.countAll<number>().as("n"))
      .executeTakeFirstOrThrow();
    return Number(row.n);
  });
  server.close();
  await idemDb.close();
});
