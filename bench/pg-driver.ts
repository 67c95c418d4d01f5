/**
 * What idem's node-postgres adapter costs in Node per statement: the statements a first-time key sends
 * through the atomic path (BEGIN, the key's lock and the locked lookup in one write, a one-INSERT
 * payment, the key row with its reply and COMMIT in one write), on pipelining clients, through the adapter's statement path as it was (a config
 * object per call, copied by node-postgres, three promises) and as it is (`runPgStatement`). Variants
 * interleave in slices within one process; CPU is this process's (process.cpuUsage), per transaction
 * and per statement, medians of the rounds. Named statements (a direct connection) and unnamed ones
 * (`prepare: false`, a transaction pooler).
 *
 *   npx tsx --conditions=source bench/pg-driver.ts   (DATABASE_URL; a database of its own, dropped)
 *   npm run bench -- --only pg-driver
 */
import { createHash, randomBytes, randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import type { Writable } from "node:stream";
import { pathToFileURL } from "node:url";
import type pg from "pg";
import { atomicSql, type LockedFound } from "../src/postgres/atomic/sql.ts";
import { jsonColumn, type QueryResult } from "../src/postgres/db.ts";
import { fromPg, runPgStatement } from "../src/postgres/drivers/pg.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../src/postgres/store.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";

const ROUNDS = Number(process.env.BENCH_PG_DRIVER_ROUNDS ?? 5);
const SLICE_MS = Number(process.env.BENCH_PG_DRIVER_SECONDS ?? 1.5) * 1000;
const CLIENTS = 8;
const STATEMENTS_PER_TX = 6;

type Run = (
  client: pg.PoolClient,
  sql: string,
  params: readonly unknown[] | undefined,
  named: boolean,
) => Promise<QueryResult<any>>;

/** The adapter's statement path before this benchmark's change (kept here as the baseline). */
const names = new Map<string, string>();
function beforeName(text: string): string {
  let name = names.get(text);
  if (!name) {
    name = `idem_${createHash("sha1").update(text).digest("hex").slice(0, 16)}`;
    names.set(text, name);
  }
  return name;
}
const beforeRun: Run = (client, sql, params, named) => {
  const values = params?.map((p) => (p instanceof Uint8Array && !Buffer.isBuffer(p) ? Buffer.from(p) : p));
  return client
    .query(named ? { text: sql, values, name: beforeName(sql) } : { text: sql, values })
    .then((r) => ({ rows: r.rows, rowCount: r.rowCount ?? 0 }));
};
const afterRun: Run = (client, sql, params, named) => runPgStatement(client, sql, params, named);

export interface PgDriverRow {
  variant: string;
  /** CPU of this process per transaction (6 statements), µs: median of the rounds. */
  usPerTx: number;
  usPerStatement: number;
  txPerS: number;
}

function load(): string {
  try {
    return readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" ");
  } catch {
    return "n/a";
  }
}

export async function pgDriverBench(): Promise<PgDriverRow[]> {
  const fresh = await freshBenchDatabase();
  const pool = benchPool(fresh.url, { max: CLIENTS, pipeline: true });
  const db = fromPg(pool, { owned: false });
  try {
    await migrate(db);
    await db.exec(
      "CREATE TABLE payments (id bigserial PRIMARY KEY, account text NOT NULL, amount_cents int NOT NULL)",
    );
    const store = await PostgresStore.open(db);
    const sql = atomicSql(store.schema, store.dbTime);
    const pay = "INSERT INTO payments (account, amount_cents) VALUES ($1, $2) RETURNING id";
    const headers = JSON.stringify([["content-type", "application/json"]]);
    const body = new TextEncoder().encode('{"id":"1","amount_cents":5000}');

    /**
     * One first-time key, as the atomic path sends it: BEGIN with the lock and the lookup in one write,
     * the payment, then the key row and COMMIT in one write (BEGIN and COMMIT are the adapter's strings).
     */
    const tx = async (client: pg.PoolClient, run: Run, named: boolean) => {
      const key = randomUUID();
      const stream = (client as unknown as { connection: { stream: NodeJS.WritableStream & Writable } })
        .connection.stream;
      stream.cork();
      // The lock is a statement of its own behind BEGIN (this driver takes one), as the adapter sends it.
      const lock = store.lockSql("acct_1", key);
      const begin = client.query(typeof lock === "string" ? `BEGIN; ${lock}` : "BEGIN");
      const locked = typeof lock === "string" ? undefined : run(client, lock.sql, lock.params, named);
      const lookup = run(client, sql.lockedLookupAround(Date.now()), ["acct_1", key], named);
      stream.uncork();
      await begin;
      await locked;
      const [live] = jsonColumn<LockedFound>((await lookup).rows[0]!.found);
      if (live !== null) throw new Error("the lookup found a fresh key");
      if ((await run(client, pay, ["acct_1", 5000], named)).rowCount !== 1) throw new Error("no payment");
      stream.cork();
      const done = run(
        client,
        sql.insertDone,
        ["acct_1", key, randomBytes(32), 201, headers, body, null, randomUUID()],
        named,
      );
      const commit = client.query("COMMIT");
      stream.uncork();
      await done;
      await commit;
    };

    const clients = await Promise.all(Array.from({ length: CLIENTS }, () => pool.connect()));
    const variants: [string, Run, boolean][] = [
      ["before, named", beforeRun, true],
      ["after, named", afterRun, true],
      ["before, unnamed (prepare: false)", beforeRun, false],
      ["after, unnamed (prepare: false)", afterRun, false],
    ];
    const slices = new Map<string, { us: number; rate: number }[]>(variants.map(([n]) => [n, []]));
    const loads: string[] = [load()];
    try {
      for (let round = 0; round <= ROUNDS; round++) {
        for (const [name, run, named] of variants) {
          const ms = round === 0 ? 500 : SLICE_MS;
          const t0 = performance.now();
          const c0 = process.cpuUsage();
          let n = 0;
          await Promise.all(
            clients.map(async (client) => {
              while (performance.now() - t0 < ms) {
                await tx(client, run, named);
                n++;
              }
            }),
          );
          const c = process.cpuUsage(c0);
          const s = (performance.now() - t0) / 1000;
          if (round > 0) slices.get(name)!.push({ us: (c.user + c.system) / n, rate: n / s });
        }
        loads.push(load());
      }
    } finally {
      for (const c of clients) c.release();
    }
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
    console.log(
      `node-postgres adapter, first-time key statements (${STATEMENTS_PER_TX} per transaction), ` +
        `${CLIENTS} pipelining clients, ${ROUNDS} interleaved rounds of ${SLICE_MS / 1000} s; load ${loads.join(" -> ")}`,
    );
    console.log("| variant | CPU µs / transaction, median (range) | CPU µs / statement | transactions/s |");
    console.log("|---|---:|---:|---:|");
    const rows = variants.map(([variant]) => {
      const xs = slices.get(variant)!;
      const us = median(xs.map((x) => x.us));
      const row = {
        variant,
        usPerTx: us,
        usPerStatement: us / STATEMENTS_PER_TX,
        txPerS: median(xs.map((x) => x.rate)),
      };
      const all = xs.map((x) => x.us);
      console.log(
        `| ${variant} | ${us.toFixed(1)} (${Math.min(...all).toFixed(1)}-${Math.max(...all).toFixed(1)}) | ` +
          `${row.usPerStatement.toFixed(1)} | ${row.txPerS.toFixed(0)} |`,
      );
      return row;
    });
    for (const named of ["named", "unnamed (prepare: false)"]) {
      const b = rows.find((r) => r.variant === `before, ${named}`)!;
      const a = rows.find((r) => r.variant === `after, ${named}`)!;
      console.log(
        `${named}: after / before CPU per transaction ${(a.usPerTx / b.usPerTx).toFixed(2)} ` +
          `(${(b.usPerTx - a.usPerTx).toFixed(1)} µs less)`,
      );
    }
    return rows;
  } finally {
    await pool.end();
    await fresh.drop();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  pgDriverBench().then(
    () => process.exit(0),
    (err) => {
      console.error(err);
      process.exit(1);
    },
  );
}
