/**
 * What bench/scale.ts and bench/scale-partitions.ts share: key rows filled by SQL, a load driver, and
 * per-statement WAL and buffer counts.
 */
import { createHash } from "node:crypto";
import type { Claim, StoredResponse } from "../src/core/index.ts";
import type { Db } from "../src/postgres/db.ts";

export const SLICE_MS = Number(process.env.BENCH_SCALE_SECONDS ?? 4) * 1000;
export const WORKERS = 16;
export const SCOPES = 5_000;
const enc = new TextEncoder();

export const reply: StoredResponse = {
  status: 201,
  headers: [
    ["content-type", "application/json"],
    ["location", "/v1/payments/pay_0123456789abcdef01234567"],
  ],
  body: enc.encode(
    '{"id":"pay_0123456789abcdef01234567","amount_cents":5000,"currency":"eur","status":"succeeded","created_at":"2026-11-30T12:00:00.000Z","charge":"ch_0123456789abcdef01234567"}',
  ),
};

/** The columns of a stored payment key, for row `g` (SQL). `$salt` keeps fills of one table apart. */
export const rowSql = (g: string, salt: string) => `
  'acct_' || lpad(to_hex(${g} % ${SCOPES}), 16, '0') AS scope,
  md5('${salt}:' || ${g})::uuid::text AS key,
  sha256(int8send(${g})) AS fingerprint`;

/** One of the SCOPES accounts the fills use (new keys land all over the index, as in production). */
export const randomScope = () =>
  `acct_${Math.floor(Math.random() * SCOPES)
    .toString(16)
    .padStart(16, "0")}`;

/** The same key in JS, to replay it. */
export function filledClaim(g: number, salt: string): Claim {
  const md5 = createHash("md5").update(`${salt}:${g}`).digest("hex");
  const key = `${md5.slice(0, 8)}-${md5.slice(8, 12)}-${md5.slice(12, 16)}-${md5.slice(16, 20)}-${md5.slice(20)}`;
  const g8 = Buffer.alloc(8);
  g8.writeBigInt64BE(BigInt(g));
  return {
    scope: `acct_${(g % SCOPES).toString(16).padStart(16, "0")}`,
    key,
    fingerprint: createHash("sha256").update(g8).digest(),
  };
}

/** Insert rows [from, to) of a fill into `table` (a keys partition), created over the last hour. */
export async function fill(
  db: Db,
  table: string,
  bucket: number,
  from: number,
  to: number,
  salt: string,
  nowMs: number,
) {
  for (let lo = from; lo < to; lo += 500_000) {
    const hi = Math.min(to, lo + 500_000);
    await db.exec(
      `INSERT INTO ${table} (bucket, scope, key, fingerprint, created_at, recovery_point, status, headers, body)
       SELECT ${bucket}, s.scope, s.key, s.fingerprint,
              to_timestamp(${(nowMs - 3_600_000) / 1000} + (g % 3600)), 'done', 201,
              '[["content-type","application/json"],["location","/v1/payments/pay_0123456789abcdef01234567"]]'::jsonb,
              convert_to(json_build_object('id', 'pay_' || left(md5(g::text), 24), 'amount_cents', 100 + g % 90000,
                'currency', 'eur', 'status', 'succeeded', 'created_at', '2026-11-30T12:00:00.000Z',
                'charge', 'ch_' || left(md5(g::text || 'c'), 24))::text, 'UTF8')
         FROM generate_series(${lo}, ${hi - 1}) AS g, LATERAL (SELECT ${rowSql("g", salt)}) AS s`,
    );
  }
}

export interface Slice {
  ops: number;
  rate: number;
  p50: number;
  p99: number;
}

/** Run `op` from WORKERS workers for `ms`: operations per second and latency percentiles. */
export async function drive(ms: number, op: (i: number) => Promise<unknown>): Promise<Slice> {
  const lat: number[] = [];
  let n = 0;
  const end = performance.now() + ms;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: WORKERS }, async () => {
      while (performance.now() < end) {
        const t = performance.now();
        await op(n++);
        lat.push(performance.now() - t);
      }
    }),
  );
  lat.sort((a, b) => a - b);
  const at = (q: number) => lat[Math.min(lat.length - 1, Math.floor(lat.length * q))] ?? 0;
  return {
    ops: lat.length,
    rate: (lat.length / (performance.now() - started)) * 1000,
    p50: at(0.5),
    p99: at(0.99),
  };
}

export const WAL_SAMPLE = Number(process.env.BENCH_SCALE_WAL_SAMPLE ?? 3_000);

/**
 * WAL per insert, measured per statement (EXPLAIN (ANALYZE, WAL)): the server is shared, so the WAL
 * position moves with every other database's writes too. `sample` inserts from WORKERS workers, right
 * after a CHECKPOINT when asked (each index leaf page touched for the first time since then writes a
 * full-page image). The commit record (~40 B) is not counted.
 */
export async function walPerInsert(
  db: Db,
  checkpoint: boolean,
  insert: () => { text: string; params: unknown[] },
  sample = WAL_SAMPLE,
): Promise<{ bytes: number; fpi: number }> {
  if (checkpoint) await db.exec("CHECKPOINT");
  let bytes = 0;
  let fpi = 0;
  let left = sample;
  await Promise.all(
    Array.from({ length: WORKERS }, async () => {
      while (left-- > 0) {
        const { text, params } = insert();
        const { rows } = await db.query<Record<string, unknown>>(
          `EXPLAIN (ANALYZE, WAL, FORMAT JSON) ${text}`,
          params,
        );
        const raw = Object.values(rows[0]!)[0];
        const plan = (typeof raw === "string" ? JSON.parse(raw) : raw) as [{ Plan: Record<string, number> }];
        bytes += plan[0].Plan["WAL Bytes"] ?? 0;
        fpi += plan[0].Plan["WAL FPI"] ?? 0;
      }
    }),
  );
  return { bytes: bytes / sample, fpi: fpi / sample };
}

/** Shared buffers (hit + read) of one execution of `text`, warm (the last of three runs). */
export async function buffers(db: Db, text: string, params: unknown[]): Promise<number> {
  let n = 0;
  for (let i = 0; i < 3; i++) {
    const { rows } = await db.query<Record<string, unknown>>(
      `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${text}`,
      params,
    );
    const raw = Object.values(rows[0]!)[0];
    const plan = (typeof raw === "string" ? JSON.parse(raw) : raw) as [{ Plan: Record<string, number> }];
    n = (plan[0].Plan["Shared Hit Blocks"] ?? 0) + (plan[0].Plan["Shared Read Blocks"] ?? 0);
  }
  return n;
}

export const f0 = (n: number) => n.toLocaleString("en-US", { maximumFractionDigits: 0 });
export const f1 = (n: number) => n.toFixed(1);
export const f2 = (n: number) => n.toFixed(2);
