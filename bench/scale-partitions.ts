/**
 * bench/scale.ts, parts 2 and 3: the index entry (text primary key against a 16-byte hash), and lookups
 * with as many live partitions as each retention and width make.
 */
import { createHash, randomBytes, randomUUID } from "node:crypto";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { livePartitions, MAX_LIVE_PARTITIONS } from "../src/postgres/schema/partitions.ts";
import { PostgresStore } from "../src/postgres/store.ts";
import { benchPool } from "./http.ts";
import {
  buffers,
  drive,
  f0,
  f1,
  f2,
  fill,
  randomScope,
  rowSql,
  type Slice,
  WORKERS,
  walPerInsert,
} from "./scale-lib.ts";

/**
 * Partition counts above this are not measured: every backend locks each partition and its index for a
 * lookup (a generic plan), and 170 partitions x 16 connections would fill the server's shared lock table
 * (max_locks_per_transaction x max_connections) for every other database on it. Issue 20 measured 171
 * hourly partitions at 0.17-0.28x the throughput of one.
 */
export const MAX_MEASURED_PARTITIONS = 40;
export const HASH_KEYS = Number(process.env.BENCH_SCALE_HASH_KEYS ?? 1_000_000);
const DAY_MS = 86_400_000;

export interface IndexRow {
  name: string;
  indexBytesPerKey: number;
  walPerInsert: number;
  fpiPerInsert: number;
  probeBuffers: number;
}

/** Part 2: the primary key on (scope, key, bucket) against a 16-byte hash of (scope, key) + bucket. */
export async function indexEntries(url: string, n: number): Promise<IndexRow[]> {
  const pool = benchPool(url, { max: WORKERS, pipeline: true });
  const db = fromPg(pool);
  try {
    await db.exec(`CREATE SCHEMA hx;
      CREATE TABLE hx.text_pk (bucket int NOT NULL, scope text NOT NULL, key text NOT NULL, fingerprint bytea NOT NULL,
                               PRIMARY KEY (scope, key, bucket));
      CREATE TABLE hx.hash_pk (bucket int NOT NULL, key_hash uuid NOT NULL, scope text NOT NULL, key text NOT NULL,
                               fingerprint bytea NOT NULL, PRIMARY KEY (key_hash, bucket))`);
    const hash =
      "encode(substring(sha256(convert_to(s.scope || chr(1) || s.key, 'UTF8')) for 16), 'hex')::uuid";
    for (let lo = 0; lo < n; lo += 500_000) {
      const hi = Math.min(n, lo + 500_000);
      const from = `FROM generate_series(${lo}, ${hi - 1}) AS g, LATERAL (SELECT ${rowSql("g", "hx")}) AS s`;
      await db.exec(`INSERT INTO hx.text_pk SELECT 1, s.scope, s.key, s.fingerprint ${from}`);
      await db.exec(`INSERT INTO hx.hash_pk SELECT 1, ${hash}, s.scope, s.key, s.fingerprint ${from}`);
    }
    await db.exec("VACUUM ANALYZE hx.text_pk, hx.hash_pk");
    const out: IndexRow[] = [];
    for (const [name, table] of [
      ["(scope, key, bucket), text", "hx.text_pk"],
      ["(hash16(scope, key), bucket)", "hx.hash_pk"],
    ] as const) {
      const wal = await walPerInsert(db, true, () => {
        const scope = randomScope();
        const key = randomUUID();
        if (table === "hx.text_pk") {
          return {
            text: "INSERT INTO hx.text_pk VALUES (1, $1, $2, $3)",
            params: [scope, key, randomBytes(32)],
          };
        }
        const h = createHash("sha256")
          .update(`${scope}\u0001${key}`)
          .digest()
          .subarray(0, 16)
          .toString("hex");
        return {
          text: "INSERT INTO hx.hash_pk VALUES (1, $1::uuid, $2, $3, $4)",
          params: [h, scope, key, randomBytes(32)],
        };
      });
      const { rows } = await db.query<{ i: string; n: string }>(
        `SELECT pg_indexes_size('${table}'::regclass) AS i, (SELECT count(*) FROM ${table}) AS n`,
      );
      const probe =
        table === "hx.text_pk"
          ? await buffers(db, "SELECT 1 FROM hx.text_pk WHERE scope = $1 AND key = $2 AND bucket = 1", [
              "acct_x",
              randomUUID(),
            ])
          : await buffers(db, "SELECT 1 FROM hx.hash_pk WHERE key_hash = $1::uuid AND bucket = 1", [
              randomUUID(),
            ]);
      out.push({
        name,
        indexBytesPerKey: Number(rows[0]!.i) / Number(rows[0]!.n),
        walPerInsert: wal.bytes,
        fpiPerInsert: wal.fpi,
        probeBuffers: probe,
      });
    }
    return out;
  } finally {
    await db.close();
  }
}

export interface WidthRow {
  partitions: number;
  lookups: Slice;
  missBuffers: number;
}

/** Part 3: lookup misses with K live partitions (hourly, 2,000 keys each), K growing as sweep would keep them. */
export async function widths(url: string, counts: number[]): Promise<WidthRow[]> {
  const pool = benchPool(url, { max: WORKERS, pipeline: true });
  const db = fromPg(pool);
  try {
    // A schema per count, each with only its live partitions (as sweep keeps them), so that the counts
    // can be measured in interleaved rounds.
    const setups = [];
    for (const k of [...counts].sort((x, y) => x - y)) {
      const schema = `w${k}`;
      await migrate(db, { schema, partitionSeconds: 3_600 });
      const store = await PostgresStore.open(db, { schema, retentionMs: 3_600_000 });
      const now = Date.now();
      const b = store.partitions.bucketOf(now);
      const buckets = Array.from({ length: k }, (_, i) => b + 1 - i);
      await store.partitions.ensure(buckets);
      for (const bk of buckets)
        await fill(db, `${schema}.keys_b${bk}`, bk, 0, 2_000, `w${bk}`, (bk + 1) * 3_600_000);
      const attached = await store.partitions.list();
      if (attached.length !== k) throw new Error(`${schema}: ${attached.length} partitions, expected ${k}`);
      await db.exec(`ANALYZE ${schema}.keys`);
      const oldest = b + 2 - k;
      // The store's lookup, with the window as parameters instead of the database's now - retention
      // (no store opens with k hourly partitions of retention: PartitionWidthError), so that it reads
      // exactly the k live partitions.
      const text = `SELECT bucket, fingerprint, created_at, recovery_point, status, headers, body, resource_id
         FROM ${schema}.keys WHERE scope = $1 AND key = $2 AND NOT marker AND bucket >= $3
          AND created_at > $4::timestamptz ORDER BY bucket DESC LIMIT 1`;
      const params = () => ["acct_nobody", randomUUID(), oldest, new Date(oldest * 3_600_000).toISOString()];
      setups.push({ k, text, params, rates: [] as Slice[] });
    }
    for (let round = 0; round < 3; round++) {
      for (const st of setups) st.rates.push(await drive(1_000, () => db.query(st.text, st.params())));
    }
    const out: WidthRow[] = [];
    for (const st of setups) {
      const rs = st.rates.slice(1).sort((x, y) => x.rate - y.rate); // round 0 warms up
      out.push({
        partitions: st.k,
        lookups: rs[Math.floor(rs.length / 2)]!,
        missBuffers: await buffers(db, st.text, st.params()),
      });
    }
    return out;
  } finally {
    await db.close();
  }
}

export function printIndex(index: IndexRow[]): void {
  console.log(`\nIndex entry, ${f0(HASH_KEYS)} keys then single-row inserts after a CHECKPOINT:`);
  console.log(
    "| primary key | index bytes/key | WAL per insert | full-page images per insert | buffers per probe |\n|---|---:|---:|---:|---:|",
  );
  for (const r of index) {
    console.log(
      `| ${r.name} | ${f0(r.indexBytesPerKey)} | ${f0(r.walPerInsert)} B | ${f2(r.fpiPerInsert)} | ${r.probeBuffers} |`,
    );
  }
}

/** Retention x width combinations of the table. */
function combos(): [string, number, string, number][] {
  const out: [string, number, string, number][] = [];
  for (const [rn, r] of [
    ["24 h", DAY_MS],
    ["7 d", 7 * DAY_MS],
    ["30 d", 30 * DAY_MS],
  ] as const) {
    for (const [wn, w] of [
      ["1 h", 3_600_000],
      ["6 h", 6 * 3_600_000],
      ["1 d", DAY_MS],
      ["3 d", 3 * DAY_MS],
    ] as const) {
      out.push([rn, r, wn, w]);
    }
  }
  return out;
}

export function widthCounts(): number[] {
  return [...new Set(combos().map(([, r, , w]) => livePartitions(r, w)))].filter(
    (k) => k <= MAX_MEASURED_PARTITIONS,
  );
}

export function printWidths(ws: WidthRow[]): void {
  const byK = new Map(ws.map((w) => [w.partitions, w]));
  const k0 = ws[0]!;
  console.log(
    `\nRetention x partition width: lookup misses with the partitions a lookup touches (the store refuses more than ${MAX_LIVE_PARTITIONS}):`,
  );
  console.log(
    "| retention | width | partitions | accepted | lookups/s (ratio) | p50 / p99 ms | buffers per miss |",
  );
  console.log("|---|---|---:|---|---:|---:|---:|");
  for (const [rn, r, wn, w] of combos()) {
    const k = livePartitions(r, w);
    const m = byK.get(k);
    if (!m) {
      console.log(`| ${rn} | ${wn} | ${k} | no | not measured (lock table) | | |`);
      continue;
    }
    console.log(
      `| ${rn} | ${wn} | ${k} | ${k <= MAX_LIVE_PARTITIONS ? "yes" : "no"} | ${f0(m.lookups.rate)} (${f2(m.lookups.rate / k0.lookups.rate)}x) | ` +
        `${f1(m.lookups.p50)} / ${f1(m.lookups.p99)} | ${m.missBuffers} |`,
    );
  }
}
