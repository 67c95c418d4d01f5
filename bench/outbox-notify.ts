/**
 * What waking the outbox's relays costs the transactions that write events, in one run on the real
 * PostgreSQL. PostgreSQL makes every transaction that sends a NOTIFY wait, at commit, for one lock of
 * the whole cluster, held through the commit's WAL flush, and queues each notification even when
 * nobody listens. Three ways, in alternating half-second slices so that all see the same machine:
 *
 *   inside   the outbox's trigger sends a NOTIFY from every writer's transaction (what a writer that
 *            is not a transaction of idem's drivers gets, and every writer before sql/0015)
 *   after    idem's driver (fromPg) sends it after the commit, outside, shared by the transactions
 *            that commit meanwhile (`Tx.notifyAfterCommit`)
 *   none     no NOTIFY at all (the trigger dropped, writes as in `inside`): relays would only poll
 *
 * Writers run what a service runs per payment: BEGIN; INSERT the payment; writeOutbox; COMMIT, with
 * BENCH_CONCURRENCY (default 32) in flight on a pool of 20. Printed: transactions per second of each,
 * their ratios to `none`, and PostgreSQL's CPU per transaction.
 *
 *   npx tsx --conditions=source bench/outbox-notify.ts     (DATABASE_URL, default postgres://postgres@127.0.0.1:5432/test)
 *
 * BENCH_SECONDS (default 6) per way.
 */
import type { Db, Queryable } from "../src/postgres/db.ts";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { writeOutbox } from "../src/postgres/outbox.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { processesCpuUs } from "./compare/cpu.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";

const SECONDS = Number(process.env.BENCH_SECONDS ?? 6);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 32);
const SLICE_S = 0.5;

type Way = "inside" | "after" | "none";

export interface OutboxNotifyResult {
  /** Writer transactions per second, each way. */
  tps: Record<Way, number>;
  /** PostgreSQL's CPU per writer transaction (µs), each way (0 where /proc is missing). */
  postgresUs: Record<Way, number>;
  /** inside / none and after / none: 1.0 means waking the relays costs the writers nothing. */
  insideRatio: number;
  afterRatio: number;
}

/**
 * Writer transactions for `seconds`, CONCURRENCY at a time: how many, and how long they took. With
 * `hideHook`, writeOutbox sees a plain statement runner instead of the driver's transaction, so it
 * cannot ask for the NOTIFY after commit and leaves it to the trigger.
 */
async function writeFor(
  db: Db,
  seconds: number,
  offset: number,
  hideHook: boolean,
): Promise<{ n: number; ms: number }> {
  let n = 0;
  let next = offset;
  const t0 = performance.now();
  const until = t0 + seconds * 1000;
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (performance.now() < until) {
        const i = next++;
        await db.transaction(async (tx) => {
          await tx.query("INSERT INTO payments (id, amount_cents, currency) VALUES ($1, $2, $3)", [
            `pay_${i}`,
            5000,
            "eur",
          ]);
          const writer: Queryable = hideHook ? { query: (sql, params) => tx.query(sql, params) } : tx;
          await writeOutbox(writer, {
            topic: "receipt-email",
            type: "payment.succeeded",
            payload: { payment: `pay_${i}`, amount_cents: 5000 },
          });
        });
        n++;
      }
    }),
  );
  return { n, ms: performance.now() - t0 };
}

export async function outboxNotifyBench(): Promise<OutboxNotifyResult> {
  const fresh = await freshBenchDatabase();
  const db = fromPg(benchPool(fresh.url, { max: 20, pipeline: true }));
  try {
    await migrate(db);
    await db.exec(`CREATE TABLE payments (id text PRIMARY KEY, amount_cents int NOT NULL, currency text NOT NULL,
                   created_at timestamptz NOT NULL DEFAULT now())`);
    const drop = "DROP TRIGGER outbox_notify ON idem.outbox";
    // As sql/0003_messaging.sql creates it.
    const create = `CREATE TRIGGER outbox_notify AFTER INSERT ON idem.outbox
                      FOR EACH STATEMENT EXECUTE FUNCTION idem.outbox_notify()`;
    const sides: Record<Way, { n: number; ms: number; pgUs: number }> = {
      inside: { n: 0, ms: 0, pgUs: 0 },
      after: { n: 0, ms: 0, pgUs: 0 },
      none: { n: 0, ms: 0, pgUs: 0 },
    };
    let offset = 0;
    for (const hide of [true, false]) await writeFor(db, 0.5, 1e9 + offset++ * 1e8, hide); // warm-up
    let triggered = true;
    const ways: Way[] = ["inside", "after", "none"];
    const rounds = Math.max(1, Math.round(SECONDS / SLICE_S));
    for (let round = 0; round < rounds; round++) {
      // Each round in the other order, so that no way always runs first.
      for (const way of round % 2 === 0 ? ways : [...ways].reverse()) {
        const wantTrigger = way !== "none";
        if (wantTrigger !== triggered) {
          await db.exec(wantTrigger ? create : drop);
          triggered = wantTrigger;
        }
        const pg0 = processesCpuUs("postgres");
        const r = await writeFor(db, SLICE_S, offset, way !== "after");
        const side = sides[way];
        side.pgUs += processesCpuUs("postgres") - pg0;
        side.n += r.n;
        side.ms += r.ms;
        offset += r.n + CONCURRENCY;
      }
    }
    if (!triggered) await db.exec(create);
    const tps = (w: Way) => (sides[w].n / sides[w].ms) * 1000;
    const pgUs = (w: Way) => sides[w].pgUs / sides[w].n;
    const result: OutboxNotifyResult = {
      tps: { inside: tps("inside"), after: tps("after"), none: tps("none") },
      postgresUs: { inside: pgUs("inside"), after: pgUs("after"), none: pgUs("none") },
      insideRatio: tps("inside") / tps("none"),
      afterRatio: tps("after") / tps("none"),
    };
    console.log(
      `Writers of one payment and one outbox event per transaction (real PostgreSQL, pg pipelined, pool 20, ${CONCURRENCY} in flight, ${SECONDS} s each way, interleaved)`,
    );
    const line = (w: Way, label: string) =>
      console.log(
        `  ${label.padEnd(44)} ${tps(w).toFixed(0).padStart(6)} transactions/s  (${sides[w].n}); PostgreSQL's CPU ${pgUs(w).toFixed(0)} µs each`,
      );
    line("inside", "NOTIFY inside each transaction (trigger)");
    line("after", "NOTIFY after commit, shared (idem's driver)");
    line("none", "no NOTIFY (relays only poll)");
    console.log(
      `inside / none = ${result.insideRatio.toFixed(2)}, after commit / none = ${result.afterRatio.toFixed(2)}`,
    );
    return result;
  } finally {
    await db.close();
    await fresh.drop();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  outboxNotifyBench().catch((err) => {
    console.error(err);
    process.exitCode = 1;
  });
}
