/**
 * idem's atomic keyed path against the hand-written transaction (bench/compare/hand.ts) without HTTP:
 * the same one-INSERT payment, one new key per call, from 32 concurrent callers on one pg pool of 10
 * (pipeline), in one process. Interleaved rounds; per variant the median throughput, and CPU per call
 * of this process (node) and of the database's backends (PostgreSQL, from /proc). bare and hand-tx send
 * their statements named (prepared once per connection), as idem does.
 *
 *   npx tsx --conditions=source bench/atomic-floor.ts   (DATABASE_URL; a database of its own, dropped)
 *
 * FLOOR_ROUNDS (default 5), FLOOR_SECONDS (default 2), FLOOR_ONLY=idem (bare and hand-tx always run;
 * `atomic,lock`: idem's path as it is and without the key's lock, to price the lock).
 */
import { randomBytes, randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import pg from "pg";
import type { Claim, StoredResponse } from "../src/core/index.ts";
import type { AtomicSql } from "../src/postgres/atomic/sql.ts";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../src/postgres/store.ts";
import { backendsCpu, backendsDelta } from "./compare/cpu.ts";
import { PAYMENTS_DDL } from "./compare/handler.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";

const ROUNDS = Number(process.env.FLOOR_ROUNDS ?? 5);
const SLICE_MS = Number(process.env.FLOOR_SECONDS ?? 2) * 1000;
const CALLERS = 32;
const enc = new TextEncoder();
const INSERT =
  "INSERT INTO payments (idem_key, amount_cents, currency) VALUES ($1, $2, $3) RETURNING id, amount_cents, currency";
const CLAIM = "INSERT INTO hand_keys (key) VALUES ($1) ON CONFLICT DO NOTHING";
const SAVE = "UPDATE hand_keys SET status = $2, body = $3 WHERE key = $1";

/** Named, so prepared once per connection as idem's own statements are (issue 65). */
const named = (name: string, text: string) => (values: unknown[]) => ({ name, text, values });
const insert = named("hand_insert", INSERT);
const claimKey = named("hand_claim", CLAIM);
const saveReply = named("hand_save", SAVE);

type Wire = { cork(): void; uncork(): void };
const wireOf = (c: pg.PoolClient) => (c as unknown as { connection: { stream: Wire } }).connection.stream;

async function handTx(pool: pg.Pool, key: string): Promise<void> {
  const client = await pool.connect();
  const wire = wireOf(client);
  try {
    wire.cork();
    const begin = client.query("BEGIN");
    const claimed = client.query(claimKey([key]));
    const paid = client.query(insert([key, 5000, "eur"]));
    wire.uncork();
    paid.catch(() => {});
    await begin;
    if ((await claimed).rowCount === 0) throw new Error("taken");
    const body = JSON.stringify((await paid).rows[0]);
    wire.cork();
    const save = client.query(saveReply([key, 201, body]));
    const commit = client.query("COMMIT");
    wire.uncork();
    await save;
    await commit;
  } catch (err) {
    await client.query("ROLLBACK").catch(() => {});
    throw err;
  } finally {
    client.release();
  }
}

const fresh = await freshBenchDatabase();
const admin = new pg.Client({
  connectionString: process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test",
});
await admin.connect();
const dbName = new URL(fresh.url).pathname.slice(1);
const idemPool = benchPool(fresh.url, { max: 10, pipeline: true });
const handPool = benchPool(fresh.url, { max: 10, pipeline: true });
const db = fromPg(idemPool);
try {
  await db.exec(PAYMENTS_DDL);
  await migrate(db);
  const store = await PostgresStore.open(db);
  // The path as it was before issue 30: the lock as SQL text sent with BEGIN (what drivers without a
  // parameterised `begin` still get), the key row always through the upsert, and the lookup's
  // partitions pruned at every execution.
  const before = await PostgresStore.open({ ...db, supportsBeginParams: false });
  const internals = before as unknown as { statements: AtomicSql };
  const old = internals.statements;
  internals.statements = {
    ...old,
    insertDone: old.replaceDone,
    lockedLookupAround: () => old.lockedLookup,
  };
  // What the key's lock costs (FLOOR_ONLY=lock): the same path without it. Not safe (duplicates in
  // other processes are no longer serialised): a price, the most that folding the lock into the
  // lookup could save.
  const unlocked = await PostgresStore.open(db);
  (unlocked as unknown as { lockSql(): string }).lockSql = () => "";
  const pay = async (tx: { query: typeof db.query }, key: string) => {
    const { rows } = await tx.query<{ id: string }>(INSERT, [key, 5000, "eur"]);
    const response: StoredResponse = {
      status: 201,
      headers: [["content-type", "application/json"]],
      body: enc.encode(JSON.stringify(rows[0])),
    };
    return { response, save: response };
  };
  const variants: Record<string, () => Promise<unknown>> = {
    bare: () => handPool.query(insert([randomUUID(), 5000, "eur"])),
    "hand-tx": () => handTx(handPool, randomUUID()),
    "idem atomic": () => {
      const claim: Claim = { scope: "acct_bench", key: randomUUID(), fingerprint: randomBytes(32) };
      return store.atomic(claim, (tx) => pay(tx, claim.key), { speculate: true });
    },
    "idem without the lock": () => {
      const claim: Claim = { scope: "acct_bench", key: randomUUID(), fingerprint: randomBytes(32) };
      return unlocked.atomic(claim, (tx) => pay(tx, claim.key), { speculate: true });
    },
    "idem before": () => {
      const claim: Claim = { scope: "acct_bench", key: randomUUID(), fingerprint: randomBytes(32) };
      return before.atomic(claim, (tx) => pay(tx, claim.key), { speculate: true });
    },
  };
  const only = process.env.FLOOR_ONLY?.split(",");
  const chosen = Object.entries(variants).filter(
    ([name]) => name === "bare" || name === "hand-tx" || !only || only.some((o) => name.includes(o)),
  );
  const got = new Map<string, { rate: number; nodeUs: number; pgUs: number }[]>();
  for (let round = 0; round <= ROUNDS; round++) {
    for (const [name, op] of chosen) {
      const ms = round === 0 ? 1000 : SLICE_MS;
      const pg0 = await backendsCpu(admin, dbName);
      const cpu0 = process.cpuUsage();
      const t0 = performance.now();
      let n = 0;
      const end = t0 + ms;
      await Promise.all(
        Array.from({ length: CALLERS }, async () => {
          while (performance.now() < end) {
            await op();
            n++;
          }
        }),
      );
      const secs = (performance.now() - t0) / 1000;
      const cpu = process.cpuUsage(cpu0);
      const pgUs = backendsDelta(pg0, await backendsCpu(admin, dbName));
      if (round === 0) continue;
      got.set(name, [
        ...(got.get(name) ?? []),
        { rate: n / secs, nodeUs: (cpu.user + cpu.system) / n, pgUs: pgUs / n },
      ]);
    }
  }
  const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  const handRates = got.get("hand-tx")?.map((r) => r.rate);
  console.log(`${ROUNDS} rounds of ${SLICE_MS} ms, ${CALLERS} callers, pool 10; load ${loadavg()}`);
  for (const [name, rs] of got) {
    const ratios = handRates ? rs.map((r, i) => r.rate / handRates[i]!) : [];
    console.log(
      `  ${name.padEnd(14)} ${med(rs.map((r) => r.rate))
        .toFixed(0)
        .padStart(6)}/s` +
        `  node ${med(rs.map((r) => r.nodeUs))
          .toFixed(0)
          .padStart(4)} µs` +
        `  pg ${med(rs.map((r) => r.pgUs))
          .toFixed(0)
          .padStart(4)} µs` +
        (ratios.length ? `  / hand-tx ${med(ratios).toFixed(2)}` : ""),
    );
  }
} finally {
  await db.close().catch(() => {});
  await handPool.end().catch(() => {});
  await admin.end().catch(() => {});
  await fresh.drop();
}

function loadavg(): string {
  return readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" ");
}
