/**
 * What the outbox's wake-up trigger costs the transactions that write events, in one run on the real
 * PostgreSQL. The trigger (sql/0003_messaging.sql) sends a NOTIFY from every transaction that writes to
 * the outbox; PostgreSQL serialises the commits of notifying transactions behind one lock for the
 * whole cluster, held through the commit's WAL flush, and queues each notification even when nobody
 * listens.
 *
 * Writers run what a service runs per payment: BEGIN; INSERT the payment; writeOutbox; COMMIT, with
 * 32 in flight on a pool of 20. Half-second slices alternate between the trigger in place and the
 * trigger dropped (recreated exactly as the migration makes it), so both see the same machine.
 * Printed: transactions per second of each, their ratio, and PostgreSQL's CPU per transaction.
 *
 *   npx tsx --conditions=source bench/outbox-notify.ts     (DATABASE_URL, default postgres://postgres@127.0.0.1:5432/test)
 *
 * BENCH_SECONDS (default 6) per side; BENCH_CONCURRENCY (default 32) transactions in flight.
 */
import { readdirSync, readFileSync } from "node:fs";
import type { Db } from "../src/postgres/db.ts";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { migrate } from "../src/postgres/migrate.ts";
import { writeOutbox } from "../src/postgres/outbox.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";

const SECONDS = Number(process.env.BENCH_SECONDS ?? 6);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 32);
const SLICE_S = 0.5;

export interface OutboxNotifyResult {
  /** Writer transactions per second with the wake-up trigger, and without it. */
  withTriggerTps: number;
  withoutTriggerTps: number;
  /** with / without: 1.0 means the trigger costs nothing. */
  ratio: number;
  /** PostgreSQL's CPU per writer transaction (µs), each side (0 where /proc is missing). */
  postgresUsWith: number;
  postgresUsWithout: number;
}

/** CPU time (µs) used so far by every PostgreSQL process, from /proc (Linux; 0 elsewhere). */
function postgresCpuUs(): number {
  let ticks = 0;
  try {
    for (const pid of readdirSync("/proc")) {
      if (!/^\d+$/.test(pid)) continue;
      try {
        if (readFileSync(`/proc/${pid}/comm`, "utf8").trim() !== "postgres") continue;
        const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
        ticks += Number(fields[11]) + Number(fields[12]); // utime + stime
      } catch {
        // the process ended meanwhile
      }
    }
  } catch {
    // no /proc
  }
  return ticks * 10_000; // USER_HZ is 100 on Linux
}

/** Writer transactions for `seconds`, CONCURRENCY at a time: how many, and how long they took. */
async function writeFor(db: Db, seconds: number, offset: number): Promise<{ n: number; ms: number }> {
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
          await writeOutbox(tx, {
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
    const sides = {
      with: { n: 0, ms: 0, pgUs: 0 },
      without: { n: 0, ms: 0, pgUs: 0 },
    };
    let offset = 0;
    await writeFor(db, 1, 1e9); // warm-up: connections, prepared statements, JIT
    let triggered = true;
    for (let slice = 0; slice < 2 * Math.max(1, Math.round(SECONDS / SLICE_S)); slice++) {
      // with, without, without, with, ...: neither side always runs first
      const wantTrigger = slice % 4 === 0 || slice % 4 === 3;
      if (wantTrigger !== triggered) {
        await db.exec(wantTrigger ? create : drop);
        triggered = wantTrigger;
      }
      const pg0 = postgresCpuUs();
      const r = await writeFor(db, SLICE_S, offset);
      const side = wantTrigger ? sides.with : sides.without;
      side.pgUs += postgresCpuUs() - pg0;
      side.n += r.n;
      side.ms += r.ms;
      offset += r.n + CONCURRENCY;
    }
    if (!triggered) await db.exec(create);
    const tps = (s: { n: number; ms: number }) => (s.n / s.ms) * 1000;
    const result: OutboxNotifyResult = {
      withTriggerTps: tps(sides.with),
      withoutTriggerTps: tps(sides.without),
      ratio: tps(sides.with) / tps(sides.without),
      postgresUsWith: sides.with.pgUs / sides.with.n,
      postgresUsWithout: sides.without.pgUs / sides.without.n,
    };
    console.log(
      `Writers of one payment and one outbox event per transaction (real PostgreSQL, pg pipelined, pool 20, ${CONCURRENCY} in flight, ${SECONDS} s each, interleaved)`,
    );
    console.log(
      `  with the NOTIFY trigger     ${result.withTriggerTps.toFixed(0).padStart(6)} transactions/s  (${sides.with.n}); PostgreSQL's CPU ${result.postgresUsWith.toFixed(0)} µs each`,
    );
    console.log(
      `  without it (relays poll)    ${result.withoutTriggerTps.toFixed(0).padStart(6)} transactions/s  (${sides.without.n}); PostgreSQL's CPU ${result.postgresUsWithout.toFixed(0)} µs each`,
    );
    console.log(`with / without = ${result.ratio.toFixed(2)}`);
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
