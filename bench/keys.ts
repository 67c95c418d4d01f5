/**
 * Issue 8's benchmark: what one idempotency key costs on disk, saved in full and in compact form, and
 * what retention costs: dropping a partition against deleting its rows. On the real PostgreSQL, in a
 * database of its own (dropped afterwards).
 *
 *   npx tsx --conditions=source bench/keys.ts     (DATABASE_URL, default postgres://postgres@127.0.0.1:5432/test)
 *
 * BENCH_KEYS (default 20,000) keys per mode, written through `PostgresStore.atomic` exactly as the
 * reference service writes them (UUID keys, the payment reply the service sends: JSON body, Content-Type
 * and Location). Bytes per key = `pg_total_relation_size` of the keys partitions (table, indexes and
 * TOAST) divided by the number of keys. Then one partition of BENCH_KEYS x BENCH_KEYS_COPIES (default 10)
 * keys is removed both ways: DROP TABLE (what `sweep()` does) and DELETE + VACUUM, in time and WAL.
 */
import { randomBytes, randomUUID } from "node:crypto";
import type { Claim, StoredResponse } from "../src/core/index.ts";
import type { Db } from "../src/postgres/db.ts";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../src/postgres/store.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";

const KEYS = Number(process.env.BENCH_KEYS ?? 20_000);
const CONCURRENCY = 32;
/** The retention comparison removes this many times the keys written. */
const COPIES = Number(process.env.BENCH_KEYS_COPIES ?? 10);
const enc = new TextEncoder();

/** The reply the reference service sends for a payment (app/payments.ts). */
function paymentReply(): { id: string; response: StoredResponse } {
  const id = `pay_${randomBytes(12).toString("hex")}`;
  const body = {
    id,
    amount_cents: 5000,
    currency: "eur",
    status: "succeeded",
    created_at: new Date().toISOString(),
  };
  return {
    id,
    response: {
      status: 201,
      headers: [
        ["content-type", "application/json"],
        ["location", `/v1/payments/${id}`],
      ],
      body: enc.encode(JSON.stringify(body)),
    },
  };
}

interface Size {
  heap: number;
  indexes: number;
  toast: number;
  total: number;
}

/** The keys partitions' sizes in `schema`: heap, indexes, TOAST, total. */
async function keysSize(db: Db, schema: string): Promise<Size> {
  const { rows } = await db.query<Record<keyof Size, string>>(
    `SELECT coalesce(sum(pg_relation_size(c.oid)), 0) AS heap,
            coalesce(sum(pg_indexes_size(c.oid)), 0) AS indexes,
            coalesce(sum(pg_total_relation_size(c.oid) - pg_relation_size(c.oid) - pg_indexes_size(c.oid)), 0) AS toast,
            coalesce(sum(pg_total_relation_size(c.oid)), 0) AS total
       FROM pg_inherits i
       JOIN pg_class c ON c.oid = i.inhrelid
       JOIN pg_class p ON p.oid = i.inhparent
       JOIN pg_namespace n ON n.oid = p.relnamespace
      WHERE n.nspname = $1 AND p.relname = 'keys'`,
    [schema],
  );
  const r = rows[0]!;
  return { heap: Number(r.heap), indexes: Number(r.indexes), toast: Number(r.toast), total: Number(r.total) };
}

/** Write `n` keys through the atomic store, `CONCURRENCY` at a time; compact or in full. */
async function writeKeys(store: PostgresStore, n: number, compact: boolean): Promise<number> {
  const started = performance.now();
  let next = 0;
  const worker = async () => {
    while (next < n) {
      next++;
      const claim: Claim = {
        scope: `acct_${randomBytes(4).toString("hex")}`,
        key: randomUUID(),
        fingerprint: randomBytes(32),
      };
      const { id, response } = paymentReply();
      await store.atomic(claim, async () =>
        compact ? { response, save: response, compactId: id } : { response, save: response },
      );
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  return (n / (performance.now() - started)) * 1000;
}

/** Time and WAL bytes of one statement. */
async function measured(db: Db, fn: () => Promise<unknown>): Promise<{ ms: number; wal: number }> {
  const lsn = async () =>
    (await db.query<{ lsn: string }>("SELECT pg_current_wal_lsn()::text AS lsn")).rows[0]!.lsn;
  const from = await lsn();
  const started = performance.now();
  await fn();
  const ms = performance.now() - started;
  const { rows } = await db.query<{ wal: string }>(
    "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint AS wal",
    [await lsn(), from],
  );
  return { ms, wal: Number(rows[0]!.wal) };
}

const kb = (bytes: number) =>
  bytes >= 10 * 1024 * 1024 ? `${(bytes / 1024 / 1024).toFixed(0)} MiB` : `${(bytes / 1024).toFixed(0)} KiB`;

export async function keysBench(): Promise<void> {
  const fresh = await freshBenchDatabase();
  const pool = benchPool(fresh.url, { max: 20, pipeline: true });
  const db = fromPg(pool);
  try {
    const perKey: Record<string, number> = {};
    console.log(`| mode | keys | heap | indexes | TOAST | total | bytes per key | keys/s written |`);
    console.log("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (const mode of ["full", "compact"] as const) {
      const schema = `keys_${mode}`;
      await migrate(db, { schema });
      const store = await PostgresStore.open(db, { schema });
      const rate = await writeKeys(store, KEYS, mode === "compact");
      const s = await keysSize(db, schema);
      perKey[mode] = s.total / KEYS;
      console.log(
        `| ${mode} | ${KEYS} | ${kb(s.heap)} | ${kb(s.indexes)} | ${kb(s.toast)} | ${kb(s.total)} | ` +
          `${perKey[mode]!.toFixed(0)} | ${rate.toFixed(0)} |`,
      );
    }
    console.log(`compact / full bytes per key = ${(perKey.compact! / perKey.full!).toFixed(2)}`);
    const perDay = 2_000 * 86_400;
    for (const mode of ["full", "compact"]) {
      console.log(
        `  2,000 keyed writes/s kept 24 h = ${(perDay / 1e6).toFixed(1)} M keys x ${perKey[mode]!.toFixed(0)} B = ` +
          `${((perDay * perKey[mode]!) / 1e9).toFixed(0)} GB (${mode})`,
      );
    }

    // Retention: a partition of keys removed by DROP TABLE (what `sweep()` does), against the same rows
    // removed by DELETE and the VACUUM that must follow. The keys written above, copied `COPIES` times.
    await migrate(db, { schema: "deleting" });
    await PostgresStore.open(db, { schema: "deleting" });
    const cols = "bucket, scope, key, fingerprint, created_at, recovery_point, status, headers, body";
    const copy = (target: string) =>
      db.exec(
        `INSERT INTO ${target}.keys (${cols})
         SELECT bucket, scope, key || '-' || g, fingerprint, created_at, recovery_point, status, headers, body
           FROM keys_full.keys, generate_series(1, ${COPIES}) AS g`,
      );
    await copy("deleting");
    await migrate(db, { schema: "dropping" });
    await PostgresStore.open(db, { schema: "dropping" });
    await copy("dropping");
    await db.exec("CHECKPOINT"); // so that neither side pays for the copy's dirty pages
    const { rows: b } = await db.query<{ bucket: number }>("SELECT DISTINCT bucket FROM keys_full.keys");
    if (b.length !== 1) throw new Error(`expected the keys in one partition, found ${b.length}`);
    const bucket = b[0]!.bucket;
    const rows = KEYS * COPIES;
    const partitionBytes = (await keysSize(db, "dropping")).total;
    const del = await measured(db, () => db.query("DELETE FROM deleting.keys WHERE bucket = $1", [bucket]));
    const vac = await measured(db, () => db.exec(`VACUUM deleting.keys_b${bucket}`));
    const drop = await measured(db, () => db.exec(`DROP TABLE dropping.keys_b${bucket}`));
    console.log(`\nRemoving one partition of ${rows} keys (${kb(partitionBytes)}):`);
    console.log("| how | ms | WAL written |\n|---|---:|---:|");
    console.log(`| DELETE (rows stay on disk as dead tuples) | ${del.ms.toFixed(0)} | ${kb(del.wal)} |`);
    console.log(`| + VACUUM to reclaim them | ${vac.ms.toFixed(0)} | ${kb(vac.wal)} |`);
    console.log(`| DROP TABLE of the partition | ${drop.ms.toFixed(0)} | ${kb(drop.wal)} |`);
    console.log(
      `DELETE + VACUUM / DROP: ${((del.ms + vac.ms) / drop.ms).toFixed(0)}x the time, ` +
        `${((del.wal + vac.wal) / Math.max(1, drop.wal)).toFixed(0)}x the WAL`,
    );
  } finally {
    await db.close();
    await fresh.drop();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  await keysBench();
}
