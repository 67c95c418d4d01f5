// Single-statement mode: the key's claim, the charge and the saved reply in ONE autocommitted statement.
// Run it: npx tsx --conditions=source examples/single-statement.ts
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { PGlite } from "@electric-sql/pglite";
import { idempotency } from "idem/node";
import { fromPglite, migrate, PostgresStore, SingleStatementStore, statement } from "idem/postgres";

const db = fromPglite(await PGlite.create()); // or fromPg(new pg.Pool(...)), fromPostgresJs(postgres(...))
await migrate(db);
await db.exec("CREATE TABLE charges (id serial PRIMARY KEY, account text, amount_cents int, claim_id uuid)");
const store = new SingleStatementStore(await PostgresStore.open(db)); // same keys table, same retention

const server = createServer(
  idempotency(
    async (_req, { tx, scope, body }) => {
      const { amount_cents } = body as { amount_cents: unknown };
      if (typeof amount_cents !== "number") return { status: 400, body: "amount_cents must be a number" };
      // The statement reads FROM idem_claim: one row when this request holds the key, none for a duplicate.
      return statement(tx, {
        sql: `INSERT INTO charges (account, amount_cents, claim_id)
              SELECT $1, $2, claim_id FROM idem_claim RETURNING id, amount_cents`,
        params: [scope, amount_cents],
        body: "jsonb_build_object('id', id, 'amount_cents', amount_cents)::text", // the reply, built in SQL
        status: 201,
        headers: { "content-type": "application/json" },
      });
    },
    { store, scope: (req) => req.headers["x-account"] as string | undefined },
  ),
);

server.listen(0, "127.0.0.1", async () => {
  const { port } = server.address() as AddressInfo;
  const send = (amount_cents: number) =>
    fetch(`http://127.0.0.1:${port}/charges`, {
      method: "POST",
      headers: { "x-account": "acct_1", "idempotency-key": "order-7", "content-type": "application/json" },
      body: JSON.stringify({ amount_cents }),
    });
  for (const attempt of [1, 2]) {
    const r = await send(5000);
    console.log(
      `attempt ${attempt}: ${r.status} replayed=${r.headers.get("idempotent-replayed") ?? "false"} ${await r.text()}`,
    );
  }
  console.log(`another body, same key: ${(await send(9999)).status}`);
  const { rows } = await db.query("SELECT count(*)::int AS n FROM charges");
  console.log(`charges in the table: ${rows[0]?.n}`);
  server.close();
  await db.close();
});
