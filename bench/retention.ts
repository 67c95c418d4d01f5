/**
 * Retention at scale, on the real PostgreSQL: what a stored key costs, and what it costs to get rid of a
 * day of them. Two identical partitions of the keys table (one day each, the default width) are filled
 * with BENCH_RETENTION_KEYS keys (default 1,000,000) shaped like the reference service's saved payments
 * (a UUID key, a SHA-256 fingerprint, two replayed headers and a ~170-byte JSON body). Then:
 *
 *   drop     DETACH PARTITION ... CONCURRENTLY, then DROP TABLE of one partition: what `store.sweep()` does
 *   delete   DELETE FROM keys WHERE created_at < cutoff on the other: the row-by-row way, plus the
 *            VACUUM it leaves behind (the dead tuples stay on disk until then)
 *
 * and the bytes per key (pg_total_relation_size of a partition / its rows; heap, index and TOAST).
 *
 *   npx tsx --conditions=source bench/retention.ts   (DATABASE_URL, default postgres://postgres@127.0.0.1:5432/test;
 *                                                     a database of its own is created and dropped)
 */
import { pathToFileURL } from "node:url";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";

export interface RetentionResult {
  keys: number;
  /** Seconds to fill one partition (INSERT ... SELECT generate_series). */
  fillSeconds: number;
  /** pg_total_relation_size(partition) / keys, and its parts. */
  bytesPerKey: number;
  heapBytesPerKey: number;
  indexBytesPerKey: number;
  toastBytesPerKey: number;
  partitionBytes: number;
  dropMs: number;
  dropWalBytes: number;
  deleteMs: number;
  deleteWalBytes: number;
  /** Dead tuples the DELETE left (its row count): on disk until a VACUUM. */
  deadTuples: number;
  vacuumMs: number;
  vacuumWalBytes: number;
  /** The partition's size after the DELETE, then after the VACUUM. */
  bytesAfterDelete: number;
  bytesAfterVacuum: number;
}

const KEYS = Number(process.env.BENCH_RETENTION_KEYS ?? 1_000_000);
const DAY_S = 86_400;

/** One day's keys, spread evenly over the day of `bucket`, like the service's saved 201s. */
function fillSql(bucket: number, n: number): string {
  const start = bucket * DAY_S;
  return `
    INSERT INTO idem.keys_b${bucket}
      (bucket, scope, key, marker, fingerprint, created_at, recovery_point, status, headers, body)
    SELECT ${bucket},
           'acct_' || lpad(to_hex(g % 5000), 16, '0'),
           md5(${bucket} || ':' || g)::uuid::text,
           false,
           sha256(int8send(g)),
           to_timestamp(${start} + g * ${DAY_S / n}),
           'done',
           201,
           jsonb_build_array(jsonb_build_array('content-type', 'application/json'),
                             jsonb_build_array('location', '/v1/payments/pay_' || left(md5(g::text), 24))),
           convert_to(json_build_object(
             'id', 'pay_' || left(md5(g::text), 24),
             'amount_cents', 100 + g % 90000,
             'currency', 'eur',
             'status', 'succeeded',
             'created_at', to_char(to_timestamp(${start} + g * ${DAY_S / n}) AT TIME ZONE 'UTC',
                                   'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
             'charge', 'ch_' || left(md5(g::text || 'c'), 24))::text, 'UTF8')
      FROM generate_series(0, ${n - 1}) AS g`;
}

export async function retentionBench(keys = KEYS): Promise<RetentionResult> {
  const fresh = await freshBenchDatabase();
  const pool = benchPool(fresh.url, { max: 2 });
  const db = fromPg(pool);
  try {
    await migrate(db); // default partition width: one day
    const c = await pool.connect();
    try {
      const q = async <T = any>(sql: string, params?: unknown[]) => (await c.query(sql, params)).rows as T[];
      /** Statements run one after another (each its own transaction), timed together. */
      const timed = async (...statements: string[]) => {
        const before = (await q<{ lsn: string }>("SELECT pg_current_wal_lsn() AS lsn"))[0]!.lsn;
        const t = performance.now();
        let r: { rowCount: number | null } | undefined;
        for (const sql of statements) r = await c.query(sql);
        const elapsed = performance.now() - t;
        const wal = (
          await q<{ wal: string }>("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)::bigint AS wal", [
            before,
          ])
        )[0]!.wal;
        return { ms: elapsed, wal: Number(wal), rows: r?.rowCount ?? 0 };
      };
      // Two days long ago (buckets are days since the epoch): the one to drop, the one to delete.
      const today = Math.floor(Date.now() / 1000 / DAY_S);
      const [dropB, deleteB] = [today - 30, today - 29];
      for (const b of [dropB, deleteB]) {
        await q(`CREATE TABLE idem.keys_b${b} PARTITION OF idem.keys FOR VALUES FROM (${b}) TO (${b + 1})`);
      }
      const t0 = performance.now();
      await q(fillSql(dropB, keys));
      const fillSeconds = (performance.now() - t0) / 1000;
      // The same rows a day later (cheaper than generating them again; the index is built the same way).
      await q(
        `INSERT INTO idem.keys_b${deleteB} (bucket, scope, key, marker, fingerprint, created_at, recovery_point,
                                           status, headers, body)
         SELECT ${deleteB}, scope, key, marker, fingerprint, created_at + interval '1 day', recovery_point,
                status, headers, body
           FROM idem.keys_b${dropB}`,
      );
      await q(`VACUUM ANALYZE idem.keys_b${dropB}, idem.keys_b${deleteB}`);
      await q("CHECKPOINT");

      const size = async (b: number) => {
        const [r] = await q<{ total: string; heap: string; index: string; toast: string }>(
          `SELECT pg_total_relation_size(c.oid) AS total, pg_relation_size(c.oid) AS heap,
                  pg_indexes_size(c.oid) AS index,
                  coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0) AS toast
             FROM pg_class c WHERE c.oid = $1::regclass`,
          [`idem.keys_b${b}`],
        );
        return {
          total: Number(r!.total),
          heap: Number(r!.heap),
          index: Number(r!.index),
          toast: Number(r!.toast),
        };
      };
      const s = await size(dropB);

      // What the sweep does: detach without blocking the keys table, then drop the detached table.
      const drop = await timed(
        `ALTER TABLE idem.keys DETACH PARTITION idem.keys_b${dropB} CONCURRENTLY`,
        `DROP TABLE idem.keys_b${dropB}`,
      );
      const cutoff = new Date((deleteB + 1) * DAY_S * 1000).toISOString();
      const del = await timed(`DELETE FROM idem.keys WHERE created_at < '${cutoff}'`);
      const afterDelete = await size(deleteB);
      const vacuum = await timed(`VACUUM idem.keys_b${deleteB}`);
      const afterVacuum = await size(deleteB);

      return {
        keys,
        fillSeconds,
        bytesPerKey: s.total / keys,
        heapBytesPerKey: s.heap / keys,
        indexBytesPerKey: s.index / keys,
        toastBytesPerKey: s.toast / keys,
        partitionBytes: s.total,
        dropMs: drop.ms,
        dropWalBytes: drop.wal,
        deleteMs: del.ms,
        deleteWalBytes: del.wal,
        deadTuples: del.rows,
        vacuumMs: vacuum.ms,
        vacuumWalBytes: vacuum.wal,
        bytesAfterDelete: afterDelete.total,
        bytesAfterVacuum: afterVacuum.total,
      };
    } finally {
      c.release();
    }
  } finally {
    await db.close();
    await fresh.drop();
  }
}

const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;

export function printRetention(r: RetentionResult): void {
  const n = r.keys.toLocaleString("en-US");
  console.log(`Retention: one day partition of ${n} keys (filled in ${r.fillSeconds.toFixed(1)} s)`);
  console.log(
    `  size per stored key: ${r.bytesPerKey.toFixed(0)} bytes (heap ${r.heapBytesPerKey.toFixed(0)}, primary key index ${r.indexBytesPerKey.toFixed(0)}, TOAST ${r.toastBytesPerKey.toFixed(0)}); ${mib(r.partitionBytes)} per partition`,
  );
  console.log(
    `  DETACH + DROP of the partition:${r.dropMs.toFixed(1).padStart(9)} ms, WAL ${mib(r.dropWalBytes)}`,
  );
  console.log(
    `  DELETE ... WHERE created_at <: ${r.deleteMs.toFixed(1).padStart(9)} ms, WAL ${mib(r.deleteWalBytes)}, ${r.deadTuples.toLocaleString("en-US")} dead tuples (${mib(r.bytesAfterDelete)} still on disk)`,
  );
  console.log(
    `  + the VACUUM it needs:         ${r.vacuumMs.toFixed(1).padStart(9)} ms, WAL ${mib(r.vacuumWalBytes)} (${mib(r.bytesAfterVacuum)} left)`,
  );
  console.log(
    `  delete + vacuum / drop = ${((r.deleteMs + r.vacuumMs) / r.dropMs).toFixed(0)}x the time, ${((r.deleteWalBytes + r.vacuumWalBytes) / Math.max(1, r.dropWalBytes)).toFixed(0)}x the WAL`,
  );
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  retentionBench().then(printRetention, (err) => {
    console.error(err);
    process.exitCode = 1;
  });
}
