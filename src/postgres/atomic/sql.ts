/**
 * Atomic mode's statements, with the store's time (db-time.ts): every expiry is the database's.
 *
 * `lookup` ($1 scope, $2 key): the key's live row as one JSON object and its body, or no row; what a
 * replay without a lock reads (`lookupAround` in the common case). `lockedLookup` (same parameters): what
 * the locked attempt reads, always one row of one JSON array (`LockedFound`): the key's live row
 * (`lockedRowOf`), whether a row of the key is in the partition a row saved now goes to, and when a key
 * saved in this transaction expires (`lockedLookupAround` in the common case).
 * `insertDone` ($1 scope, $2 key, $3 fingerprint, $4 status, $5 headers, $6 body, $7 resource id,
 * $8 claim id): the key row with its reply, as the transaction's last statement; `replaceDone` (the
 * same parameters) when an expired row of the key is in that partition.
 *
 * The `...Around` forms name the partitions to read as constants, from this process's estimate of the
 * database's time with a margin (`DbTime.rangeAround`), and bound them by nothing else: PostgreSQL then
 * prunes the others once, when it plans the statement, and works out no bucket number per execution.
 * Which rows are live is still decided by the database's clock (`created_at` against its now). Each
 * also says whether its partitions cover every one that clock says a live row may be in (`covers`);
 * when they do not, the caller reads the plain form, bounded by that clock alone. Named partitions
 * roughly halve a lookup's cost per execution: docs/decisions/named-partitions.md.
 */
import { type Db, jsonColumn } from "../db.ts";
import { DbTime } from "../keys/db-time.ts";
import type { KeyRow } from "../keys/row.ts";
import type { SharedReads } from "../keys/shared-reads.ts";

export type AtomicSql = ReturnType<typeof atomicSql>;

export function atomicSql(s: string, t: DbTime) {
  // Epoch ms, not a timestamptz: the driver parses a timestamp with a regular expression per row, and
  // every locked attempt reads this one.
  const expiresNew = `(extract(epoch FROM ${t.now}) * 1000)::float8 + ${Math.trunc(t.retentionMs)}`;
  const values = `${t.bucket}, $1, $2, $3, ${t.now}, 'done', $4, $5::text::jsonb, $6, $7, $8::uuid`;
  const insertColumns = `bucket, scope, key, fingerprint, created_at, recovery_point, status, headers,
                                     body, resource_id, claim_id`;
  // One row of ONE column whatever the key has, a JSON array: [live, here, new_expires_ms, covered].
  // node-postgres describes every column of every statement it runs, building a dictionary-mode object
  // and copying it each time, then parses every value: one JSON column is one JSON.parse (the shapes
  // measured: docs/decisions/atomic-lookup-shape.md). `live`: the newest live row as
  // one JSON object (`lockedRowOf`), null when there is none; `here`: a row of the key (live or not) is
  // in the bucket a row saved now goes to; `new_expires_ms`: when a key saved now expires, epoch ms.
  // A key row as JSON (`KeyRowJson`): bytes as hex, its creation as epoch ms (the driver parses a
  // timestamp with a regular expression per row).
  const rowJson = `'bucket', bucket, 'fingerprint', encode(fingerprint, 'hex'),
                    'created_ms', (extract(epoch FROM created_at) * 1000)::float8, 'recovery_point', recovery_point,
                    'status', status, 'headers', headers, 'resource_id', resource_id, 'claim_id', claim_id::text`;
  // A body up to INLINE_BODY_MAX bytes comes inside the JSON, as hex; a larger one is left where it is
  // (`body_elsewhere`) and the replay reads it with `lookup`, after the transaction: inline is faster
  // up to 32 KiB and slower above (docs/decisions/atomic-lookup-shape.md).
  const lockedBody = `'body', CASE WHEN octet_length(body) <= ${INLINE_BODY_MAX} THEN encode(body, 'hex') END,
                    'body_elsewhere', octet_length(body) > ${INLINE_BODY_MAX}`;
  const lockedLookup = (buckets: string, covered = "") => `SELECT json_build_array(
                 (array_agg(json_build_object(${rowJson}, ${lockedBody}) ORDER BY bucket DESC)
                    FILTER (WHERE NOT marker AND created_at > ${t.oldest}))[1],
                 coalesce(bool_or(bucket = ${t.bucket}), false), ${expiresNew}${covered}) AS found
               FROM ${s}.keys
              WHERE scope = $1 AND key = $2 AND ${buckets}`;
  // The key's live row (`keyRowOf`), or no row: every replay of a finished key reads this. Two
  // columns, not nine: node-postgres describes each column of each result and copies a row object
  // built field by field. The body stays a bytea column: as hex inside the JSON, a large reply costs
  // PostgreSQL several times more (docs/decisions/atomic-lookup-shape.md).
  // `needs_review_ms`: set on a phases-mode key whose outcome waits for a person (`replayOf`).
  const lookup = (buckets: string) => `SELECT json_build_object(${rowJson},
                      'needs_review_ms', (extract(epoch FROM needs_review_at) * 1000)::float8) AS live, body
               FROM ${s}.keys
              WHERE scope = $1 AND key = $2 AND NOT marker AND ${buckets} AND created_at > ${t.oldest}
              ORDER BY bucket DESC LIMIT 1`;
  return {
    lookup: lookup(t.window),
    /**
     * `lookup` in the partitions named from this process's estimate of the database's time
     * (`estimatedMs`), and one more row, of nulls, when they miss one the database's clock says a live
     * row may be in: the caller then reads `lookup` (`readLiveRow`).
     */
    lookupAround: t.aroundEstimate(
      (range) => `(${lookup(DbTime.named(range))})
            UNION ALL SELECT NULL, NULL WHERE NOT ${t.covers(range)}`,
    ),
    // Always one row, over every row of the key a live row may be among (markers and expired rows too;
    // a miss probes the same partitions as `lookup`): the newest live row (not a marker, within
    // retention), whether a row of the key is in the bucket a row saved now goes to (with no live row,
    // it is replaced by `replaceDone`), and when a key saved in this transaction expires.
    lockedLookup: lockedLookup(t.window),
    /**
     * `lockedLookup` in the partitions named from this process's estimate of the database's time
     * (`estimatedMs`). Its fourth element, `covered`, says whether they hold every partition the
     * database's clock says a live row may be in; when false (the estimate was off by more than the
     * margin), the caller reads `lockedLookup`.
     */
    lockedLookupAround: t.aroundEstimate((range) =>
      lockedLookup(DbTime.named(range), `, ${t.covers(range)}`),
    ),
    // The key row with its reply, when the locked lookup found no row of the key in this bucket: a plain
    // INSERT (no arbiter to look up, no subplan). A row there meanwhile fails it on the primary key
    // (23505), which rolls the transaction back. The parent is named: the bucket's partition by name
    // saved 1-2% of a keyed request's CPU, not worth it (docs/decisions/atomic-lookup-shape.md).
    insertDone: `INSERT INTO ${s}.keys (${insertColumns}) VALUES (${values})`,
    // The key row with its reply, when the locked lookup found a row of the key in this bucket that is
    // not live. One that has expired (the retention is shorter than a partition, so it is still there)
    // is replaced in place, every column reset; a live one is never touched: the second INSERT then
    // runs and fails on the primary key (23505), which rolls the transaction back.
    replaceDone: `WITH put AS (
              INSERT INTO ${s}.keys (${insertColumns})
              VALUES (${values})
              ON CONFLICT (scope, key, bucket) DO UPDATE
                 SET marker = false, fingerprint = EXCLUDED.fingerprint, created_at = EXCLUDED.created_at,
                     recovery_point = 'done', status = EXCLUDED.status, headers = EXCLUDED.headers,
                     body = EXCLUDED.body, resource_id = EXCLUDED.resource_id, lease_token = NULL,
                     lease_until = NULL, runner = NULL, request = NULL, phase_data = NULL, updated_at = NULL,
                     attempted_at = NULL, lookup_failures = 0, needs_review_at = NULL,
                     claim_id = EXCLUDED.claim_id
               WHERE ${t.expiredAgainst(`${s}.keys.created_at`, "EXCLUDED.created_at")}
              RETURNING 1
            )
            INSERT INTO ${s}.keys (bucket, scope, key, fingerprint, created_at)
            SELECT ${t.bucket}, $1, $2, $3, ${t.now} WHERE NOT EXISTS (SELECT 1 FROM put)`,
  };
}

/** A key row as the lookups return it, without its body (bytes as hex, the creation as epoch ms). */
export interface KeyRowJson {
  bucket: number;
  fingerprint: string;
  created_ms: number;
  recovery_point: string;
  status: number | null;
  headers: Array<[string, string]> | null;
  resource_id: string | null;
  claim_id: string | null;
}

/** The largest saved body `lockedLookup` returns; a replay of a larger one reads it with `lookup`. */
export const INLINE_BODY_MAX = 32_768;

/** The newest live row as `lockedLookup` returns it: with its body as hex, unless that is large. */
export interface LockedRowJson extends KeyRowJson {
  body: string | null;
  /** The body is larger than INLINE_BODY_MAX: `body` is null, and `lookup` reads it. */
  body_elsewhere: boolean | null;
}

/** `lookupAround`'s row that says its partitions miss one. */
interface Nulls {
  live: null;
  body: null;
}

/** What `lookup` returns when the key has a live row. */
export interface LookupRow {
  live: (KeyRowJson & { needs_review_ms: number | null }) | string;
  body: Uint8Array | null;
}

/** `lockedLookup`'s one column: [live, here, new_expires_ms, covered (`lockedLookupAround` only)]. */
export type LockedFound = [
  live: LockedRowJson | null,
  here: boolean,
  newExpiresMs: number,
  covered?: boolean,
];

/** The key row that `lockedLookup`'s `live` element holds. */
export function lockedRowOf(j: LockedRowJson): KeyRow {
  return keyRowOf(j, j.body === null ? null : Buffer.from(j.body, "hex"));
}

/**
 * The key's live row, or undefined: `lookupAround` (`lookup` when its partitions miss one), one read
 * shared with the replays of the key that come while it is in flight (keys/shared-reads.ts), each
 * caller with a row of its own to answer from. `estimatedMs`: this process's estimate of the
 * database's time, which names the partitions read.
 */
export function readLiveRow(
  reads: SharedReads<LookupRow | undefined>,
  db: Db,
  sql: AtomicSql,
  estimatedMs: number,
  id: string,
  claim: { scope: string; key: string },
): Promise<KeyRow | undefined> {
  const { result, joined } = reads.read(id, () => {
    const params = [claim.scope, claim.key];
    return db.query<LookupRow | Nulls>(sql.lookupAround(estimatedMs), params).then(({ rows }) => {
      for (const row of rows) if (row.live !== null) return row as LookupRow;
      // No row: the key has none live. Only the row of nulls: the partitions named miss one.
      return rows.length === 0 ? undefined : db.query<LookupRow>(sql.lookup, params).then((r) => r.rows[0]);
    });
  });
  return result.then((found) => found && lookupRowOf(found, joined));
}

/**
 * The key row `lookup` found (its `live` column parsed by the driver or not), with its body. `copy`
 * when `found` is another caller's read (keys/shared-reads.ts): the row then gets a headers list and a
 * body of its own, since the answer built from them is changed (idem appends its headers to it).
 */
export function lookupRowOf(found: LookupRow, copy = false): KeyRow {
  const j = jsonColumn(found.live);
  const row = keyRowOf(j, copy && found.body ? Buffer.from(found.body) : found.body);
  if (copy && Array.isArray(row.headers)) row.headers = row.headers.map(([name, value]) => [name, value]);
  if (j.needs_review_ms !== null) row.needs_review_at = new Date(j.needs_review_ms);
  return row;
}

function keyRowOf(j: KeyRowJson, body: Uint8Array | null): KeyRow {
  return {
    bucket: j.bucket,
    fingerprint: Buffer.from(j.fingerprint, "hex"),
    created_at: new Date(j.created_ms),
    recovery_point: j.recovery_point,
    status: j.status,
    headers: j.headers,
    body,
    resource_id: j.resource_id,
    claim_id: j.claim_id,
  };
}

/** The statement a lookup of (scope, key) runs, with its parameters (for benchmarks, tests and EXPLAIN). */
export function lookupQuery(
  table: { schema: string; dbTime: DbTime },
  scope: string,
  key: string,
): { text: string; params: unknown[] } {
  return { text: atomicSql(table.schema, table.dbTime).lookup, params: [scope, key] };
}
