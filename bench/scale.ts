/**
 * Issue 20's benchmark: does a key cost the same at 0 and at millions of keys, and at any retention?
 * On the real PostgreSQL, in a database of its own (dropped afterwards).
 *
 *   npm run bench -- scale        or   npx tsx --conditions=source bench/scale.ts
 *
 * 1. Key count. One schema (one-day partitions, 24 h retention) is filled by SQL to each size of
 *    BENCH_SCALE_KEYS (default "0,1000000"; add 5000000 if you have the time and disk) with keys shaped
 *    like the reference service's saved payments. At each size, through `PostgresStore.atomic` with 16
 *    workers on a pipelining pg pool: first-time keys and replays of stored keys (throughput, p50, p99),
 *    buffers per lookup (EXPLAIN ANALYZE BUFFERS of a miss and a hit), bytes per key, and WAL per key
 *    right after a CHECKPOINT (every index leaf touched for the first time writes a full-page image)
 *    and in a second slice of the same checkpoint cycle; at the largest size also with wal_compression.
 *    Ratios are to the empty table, in the same run.
 * 2. Index entry. The same rows under the primary key (scope, key, bucket) and under a 16-byte hash of
 *    (scope, key) plus the bucket: index bytes per key, WAL per single-row insert, buffers per probe.
 * 3. Retention x partition width. Lookups (misses) with as many live partitions as each retention and
 *    width make (ceil(retention / width) + 2), 2,000 keys in each, sweep keeping only the live ones.
 */
import { randomBytes, randomUUID } from "node:crypto";
import { pathToFileURL } from "node:url";
import type { Claim } from "../src/core/index.ts";
import { lookupQuery } from "../src/postgres/atomic/sql.ts";
import type { Db } from "../src/postgres/db.ts";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../src/postgres/store.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";
import {
  buffers,
  drive,
  f0,
  f1,
  f2,
  fill,
  filledClaim,
  randomScope,
  reply,
  SLICE_MS,
  type Slice,
  WORKERS,
  walPerInsert,
} from "./scale-lib.ts";
import {
  HASH_KEYS,
  type IndexRow,
  indexEntries,
  printIndex,
  printWidths,
  type WidthRow,
  widthCounts,
  widths,
} from "./scale-partitions.ts";

const SIZES = (process.env.BENCH_SCALE_KEYS ?? "0,1000000").split(",").map(Number);
/** Which parts to run: BENCH_SCALE_PARTS=sizes,index,widths (default all). */
const PARTS = (process.env.BENCH_SCALE_PARTS ?? "sizes,index,widths").split(",");

interface SizeRow {
  keys: number;
  first: Slice;
  replay: Slice;
  missBuffers: number;
  hitBuffers: number;
  bytesPerKey: number;
  indexBytesPerKey: number;
  walPerKey: number;
  fpiPerKey: number;
  walPerKeySecond: number;
  walPerKeyCompressed?: number;
}

async function keysTotal(db: Db, schema: string): Promise<{ rows: number; total: number; index: number }> {
  const { rows } = await db.query<{ n: string; total: string; index: string }>(
    `SELECT (SELECT count(*) FROM ${schema}.keys) AS n,
            coalesce(sum(pg_total_relation_size(i.inhrelid)), 0) AS total,
            coalesce(sum(pg_indexes_size(i.inhrelid)), 0) AS index
       FROM pg_inherits i WHERE i.inhparent = '${schema}.keys'::regclass`,
  );
  return { rows: Number(rows[0]!.n), total: Number(rows[0]!.total), index: Number(rows[0]!.index) };
}

/** Part 1: the same measurements at each key count. */
async function keyCounts(url: string): Promise<SizeRow[]> {
  const pool = benchPool(url, { max: WORKERS, pipeline: true });
  const db = fromPg(pool);
  try {
    // A schema per size, all filled first, then measured in interleaved rounds: on a shared machine the
    // load changes by the second, and only figures taken side by side compare.
    const now = Date.now();
    const setups = [];
    for (const size of SIZES) {
      const schema = `scale_${size}`;
      await migrate(db, { schema });
      const store = await PostgresStore.open(db, { schema });
      const bucket = store.partitions.bucketOf(now);
      const t0 = performance.now();
      await fill(db, `${schema}.keys_b${bucket}`, bucket, 0, size, "scale", now);
      if (size > 0) console.log(`  filled ${f0(size)} keys in ${f0((performance.now() - t0) / 1000)} s`);
      await db.exec(`VACUUM ANALYZE ${schema}.keys`);
      const written: Claim[] = [];
      const firstTime = async () => {
        const claim: Claim = { scope: randomScope(), key: randomUUID(), fingerprint: randomBytes(32) };
        await store.atomic(claim, async () => ({ response: reply, save: reply }));
        if (written.length < 100_000) written.push(claim);
      };
      const replayOf = (i: number) =>
        size > 0 ? filledClaim(Math.floor(Math.random() * size), "scale") : written[i % written.length]!;
      const replay = async (i: number) => {
        const o = await store.atomic(replayOf(i), async () => {
          throw new Error("a replay ran its work");
        });
        if (o.kind !== "replayed") throw new Error(`expected a replay, got ${o.kind}`);
      };
      /** A new key row as the store writes it (one row, routed to the current partition). */
      const keyInsert = () => ({
        text: `INSERT INTO ${schema}.keys (bucket, scope, key, fingerprint, created_at, recovery_point, status, headers, body)
               VALUES ($1, $2, $3, $4, $5::timestamptz, 'done', 201, $6::text::jsonb, $7)`,
        params: [
          bucket,
          randomScope(),
          randomUUID(),
          randomBytes(32),
          new Date().toISOString(),
          JSON.stringify(reply.headers),
          Buffer.from(reply.body),
        ],
      });
      setups.push({
        size,
        schema,
        store,
        firstTime,
        replay,
        replayOf,
        keyInsert,
        first: [] as Slice[],
        again: [] as Slice[],
      });
    }
    const ROUNDS = Number(process.env.BENCH_SCALE_ROUNDS ?? 3);
    for (let round = 0; round <= ROUNDS; round++) {
      const ms = round === 0 ? 1_000 : SLICE_MS / 2; // round 0 warms up
      for (const st of setups) {
        const f = await drive(ms, st.firstTime);
        const r = await drive(ms, st.replay);
        if (round > 0) {
          st.first.push(f);
          st.again.push(r);
        }
      }
    }
    const median = (xs: Slice[]) => [...xs].sort((x, y) => x.rate - y.rate)[Math.floor(xs.length / 2)]!;
    const out: SizeRow[] = [];
    for (const st of setups) {
      const walFirst = await walPerInsert(db, true, st.keyInsert);
      const walSecond = await walPerInsert(db, false, st.keyInsert);
      const miss = lookupQuery(st.store, "acct_nobody", randomUUID());
      const hitClaim = st.replayOf(0);
      const hit = lookupQuery(st.store, hitClaim.scope, hitClaim.key);
      const sizes = await keysTotal(db, st.schema);
      const row: SizeRow = {
        keys: st.size,
        first: median(st.first),
        replay: median(st.again),
        missBuffers: await buffers(db, miss.text, miss.params),
        hitBuffers: await buffers(db, hit.text, hit.params),
        bytesPerKey: sizes.total / sizes.rows,
        indexBytesPerKey: sizes.index / sizes.rows,
        walPerKey: walFirst.bytes,
        fpiPerKey: walFirst.fpi,
        walPerKeySecond: walSecond.bytes,
      };
      if (st.size === Math.max(...SIZES)) {
        // The same inserts with full-page images compressed (a superuser setting, set per session here).
        const zpool = benchPool(url, {
          max: WORKERS,
          pipeline: true,
          options: "-c wal_compression=lz4",
        } as { max: number; pipeline: boolean });
        const zdb = fromPg(zpool);
        try {
          row.walPerKeyCompressed = (await walPerInsert(zdb, true, st.keyInsert)).bytes;
        } finally {
          await zdb.close();
        }
      }
      out.push(row);
    }
    return out;
  } finally {
    await db.close();
  }
}

export interface ScaleResult {
  sizes: SizeRow[];
  index: IndexRow[];
  widths: WidthRow[];
}

export async function scaleBench(): Promise<ScaleResult> {
  const fresh = await freshBenchDatabase();
  try {
    const sizes = PARTS.includes("sizes") ? await keyCounts(fresh.url) : [];
    if (sizes.length) printSizes(sizes);
    const index = PARTS.includes("index") ? await indexEntries(fresh.url, HASH_KEYS) : [];
    if (index.length) printIndex(index);
    const ws = PARTS.includes("widths") ? await widths(fresh.url, widthCounts()) : [];
    if (ws.length) printWidths(ws);
    return { sizes, index, widths: ws };
  } finally {
    await fresh.drop();
  }
}

function printSizes(sizes: SizeRow[]): void {
  const base = sizes[0]!;
  console.log(
    "Key count (one-day partitions, 24 h retention; medians of interleaved rounds, ratios to the first row):",
  );
  console.log(
    "| keys | first-time/s | p50 / p99 ms | replay/s | p50 / p99 ms | buffers miss / hit | bytes/key (index) | WAL/key after CHECKPOINT | WAL/key, same cycle |",
  );
  console.log("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
  for (const r of sizes) {
    const x = (a: number, b: number) => ` (${f2(a / b)}x)`;
    console.log(
      `| ${f0(r.keys)} | ${f0(r.first.rate)}${x(r.first.rate, base.first.rate)} | ${f1(r.first.p50)} / ${f1(r.first.p99)} | ` +
        `${f0(r.replay.rate)}${x(r.replay.rate, base.replay.rate)} | ${f1(r.replay.p50)} / ${f1(r.replay.p99)} | ` +
        `${r.missBuffers} / ${r.hitBuffers} | ${f0(r.bytesPerKey)} (${f0(r.indexBytesPerKey)}) | ` +
        `${f0(r.walPerKey)} B${x(r.walPerKey, base.walPerKey)}, ${f2(r.fpiPerKey)} FPI | ${f0(r.walPerKeySecond)} B |`,
    );
  }
  const last = sizes[sizes.length - 1]!;
  if (last.walPerKeyCompressed !== undefined) {
    console.log(
      `wal_compression=lz4 at ${f0(last.keys)} keys: ${f0(last.walPerKeyCompressed)} B of WAL per key after a CHECKPOINT ` +
        `(${f2(last.walPerKeyCompressed / last.walPerKey)}x of off)`,
    );
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  scaleBench().then(
    () => process.exit(0),
    (err) => {
      console.error(err);
      process.exit(1);
    },
  );
}
