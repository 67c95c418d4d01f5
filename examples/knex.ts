// idem/knex: Express + Knex (client "pg").
// Run it: DATABASE_URL=postgres://... npx tsx --conditions=source examples/knex.ts
import express from "express";
import { idempotency, keepRawBody } from "idem/express";
import { fromKnex } from "idem/knex";
import { migrate, PostgresStore } from "idem/postgres";
import Knex from "knex";
import { DATABASE_URL, PAYMENTS_TABLE, tryTwice } from "./try-twice.ts";

const app = express();
app.use(express.json({ verify: keepRawBody }));

// #region snippet
const knex = Knex({ client: "pg", connection: DATABASE_URL });
const idemDb = fromKnex(knex); // idem runs inside Knex's transactions
await migrate(idemDb);
const store = await PostgresStore.open(idemDb);

app.post("/payments", idempotency({ store, scope: (req) => req.header("x-account") }), async (req, res) => {
  const trx = idemDb.tx(req.idempotency.tx); // a Knex.Transaction
  const [payment] = await trx("payments")
    .insert({ account: req.idempotency.scope, amount_cents: req.body.amount_cents })
    .returning(["id", "amount_cents"]);
  res.status(201).json(payment); // the insert, the key and this reply commit together
});
// #endregion snippet

await idemDb.exec(PAYMENTS_TABLE);
const server = app.listen(0, "127.0.0.1", async () => {
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : 0;
  await tryTwice(`http://127.0.0.1:${port}/payments`, async () => {
    const [row] = await knex("payments").count<{ n: string }[]>({ n: "*" });
    return Number(row?.n ?? 0);
  });
  server.close();
  await idemDb.close();
});
