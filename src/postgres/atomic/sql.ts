/**
 * Atomic mode's statements, with the store's time (db-time.ts): every expiry is the database's.
 *
 * `lookup` and `lookupAround`: the key's live row read without a lock (keys/lookup.ts). `lockedLookup`
 * ($1 scope, $2 key): what the locked attempt reads, always one row of one JSON array (`LockedFound`): the key's live row
 * (`lockedRowOf`), whether a row of the key is in the partition a row saved now goes to, and when a key
 * saved in this transaction expires (`lockedLookupAround` in the common case).
 * `insertDone` ($1 scope, $2 key, $3 fingerprint, $4 status, $5 headers, $6 body, $7 resource id,
 * $8 claim id): the key row with its reply, as the transaction's last statement; `replaceDone` (the
 * same parameters) when an expired row of the key is in that partition.
 *
 * `lockedLookupAround` names the partitions to read as constants, as `lookupAround` does (keys/lookup.ts),
 * and says whether they cover every one the database's clock says a live row may be in (`covers`); when
 * they do not, the caller reads the plain form. Named partitions roughly halve a lookup's cost per
 * execution: docs/decisions/named-partitions.md.
 */
import { DbTime } from "../keys/db-time.ts";
import { KEY_ROW_JSON, type KeyRowJson, keyRowOf, lookupSql } from "../keys/lookup.ts";
import type { KeyRow } from "../keys/row.ts";

// Read by the benchmarks and tests from here, where they always were.
export { type LookupRow, lookupQuery, lookupRowOf } from "../keys/lookup.ts";

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
  // A key row as JSON (`KeyRowJson`, keys/lookup.ts).
  const rowJson = KEY_ROW_JSON;
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
  return {
    ...lookupSql(s, t),
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

/** The largest saved body `lockedLookup` returns; a replay of a larger one reads it with `lookup`. */
export const INLINE_BODY_MAX = 32_768;

/** The newest live row as `lockedLookup` returns it: with its body as hex, unless that is large. */
export interface LockedRowJson extends KeyRowJson {
  body: string | null;
  /** The body is larger than INLINE_BODY_MAX: `body` is null, and `lookup` reads it. */
  body_elsewhere: boolean | null;
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
