// A handler whose only effect is its INSERT: `effectsInTxOnly` sends that INSERT with the key's claim.
// Two instances share one database; the retry reaches the other one, which replays and rolls back.
// Run it: npx tsx --conditions=source examples/effects-in-tx.ts   (DATABASE_URL: the real server, piped)
import { PGlite } from "@electric-sql/pglite";
import { serve } from "@hono/node-server";
import { type Env, Hono } from "hono";
import { AbandonedWorkError } from "idem";
import { idempotency } from "idem/hono";
import { type Db, fromPg, fromPglite, migrate, PostgresStore } from "idem/postgres";
import pg from "pg";

const url = process.env.DATABASE_URL;
const pipelined: pg.PoolConfig & { pipeline: boolean } = { connectionString: url, pipeline: true };
const db: Db = url
  ? fromPg(new pg.Pool(pipelined)) // one write per claim
  : fromPglite(await PGlite.create()); // no pipelining: runs the same, without the saved round trip
await migrate(db);
await db.exec("CREATE TABLE IF NOT EXISTS tx_charges (id serial PRIMARY KEY, key text, amount_cents int)");

async function instance(): Promise<{ port: number; close(): void }> {
  const store = await PostgresStore.open(db);
  const app = new Hono();
  // A retry's abandoned statements are no error worth logging: idem answers from the key instead.
  app.onError((err, c) => {
    if (!(err instanceof AbandonedWorkError)) console.error(err);
    return c.text("Internal Server Error", 500);
  });
  app.post(
    "/charges",
    idempotency<Env, { amount_cents: number }>({
      store,
      scope: (c) => c.req.header("x-account"),
      effectsInTxOnly: true,
    }),
    async (c) => {
      const { tx, key, body } = c.var.idempotency; // only tx below: no provider call, no email
      const { rows } = await tx.query(
        "INSERT INTO tx_charges (key, amount_cents) VALUES ($1, $2) RETURNING id, amount_cents",
        [key, body.amount_cents],
      );
      return c.json(rows[0], 201);
    },
  );
  return new Promise((resolve) => {
    const server = serve({ fetch: app.fetch, port: 0 }, ({ port }) =>
      resolve({ port, close: () => server.close() }),
    );
  });
}

const [a, b] = [await instance(), await instance()];
const key = `order-${crypto.randomUUID()}`; // a key of this run's own
const attempts: Array<[number, number]> = [
  [1, a.port],
  [2, b.port],
];
const replies: string[] = [];
for (const [attempt, port] of attempts) {
  const r = await fetch(`http://127.0.0.1:${port}/charges`, {
    method: "POST",
    headers: { "x-account": "acct_1", "idempotency-key": key, "content-type": "application/json" },
    body: JSON.stringify({ amount_cents: 5000 }),
  });
  const replayed = r.headers.get("idempotent-replayed") ?? "false";
  replies.push(`${r.status} ${await r.text()}`);
  console.log(
    `attempt ${attempt} on instance ${attempt === 1 ? "a" : "b"}: ${r.status} replayed=${replayed}`,
  );
}
const { rows } = await db.query("SELECT count(*)::int AS n FROM tx_charges WHERE key = $1", [key]);
console.log(`charges for the key: ${rows[0]?.n}`);
if (rows[0]?.n !== 1 || replies[0] !== replies[1] || !replies[0]?.startsWith("201")) {
  console.error("check failed: expected one charge, and the retry's reply the same as the first");
  process.exitCode = 1;
}
a.close();
b.close();
await db.close();
