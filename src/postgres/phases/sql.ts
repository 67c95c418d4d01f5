/**
 * Phases mode's SQL, per schema. Every statement is written out whole (no string surgery): the few
 * variants (a boundary marker, an asynchronous commit) are composed from named parts.
 *
 * The claim statements take: $1 bucket, $2 scope, $3 key, $4 fingerprint, $5 created_at, $6 first
 * recovery point, $7 lease token, $8 lease expiry, $9 runner name, $10 input (JSON text), $11 the oldest
 * live created_at. The fenced statements take: $1 scope, $2 key, $3 bucket, $4 our lease token; every
 * write they make ends in `AND lease_token = $4`, so a worker whose lease was taken over changes nothing.
 */
import type { KeyRow } from "../store.ts";

/** A key row as phases mode reads it. */
export interface PhaseRow extends KeyRow {
  lease_token: string | null;
  lease_until: Date | null;
  phase_data: Record<string, unknown> | null;
  /** The input stored by the key's first request (JSON). */
  request: unknown;
  /** Set before an external call of a phase whose provider does not dedup by key (sql/0007). */
  attempted_at: Date | null;
  /** Lookups of that call's effect that could not tell (the provider did not answer). */
  lookup_failures: number;
  /** The outcome is unknown and waits for a person (`idem keys settle`). */
  needs_review_at: Date | null;
}

const ROW = `bucket, fingerprint, created_at, recovery_point, status, headers, body,
             lease_token::text AS lease_token, lease_until, phase_data, request,
             attempted_at, lookup_failures, needs_review_at`;
/** The live (unexpired) row of (scope, key), given the oldest live created_at and its bucket. */
const live = (scope: string, key: string, oldest: string, bucket: string) =>
  `scope = ${scope} AND key = ${key} AND NOT marker AND bucket >= ${bucket} AND created_at > ${oldest}::timestamptz`;
const COLUMNS = `(bucket, scope, key, fingerprint, created_at, recovery_point, lease_token, lease_until, runner,
                  request, updated_at, marker)`;
const CLAIMED =
  "$2, $3, $4, $5::timestamptz, $6, $7::uuid, $8::timestamptz, $9, $10::text::jsonb, $5::timestamptz";
/**
 * A row already under this (scope, key, bucket) blocks the claim, unless it has expired: with a
 * retention shorter than a partition, a key reused after its expiry lands on its old row's primary key,
 * and "after expiry the key is new" means that row is replaced, whole.
 */
const REPLACE_EXPIRED = `ON CONFLICT (scope, key, bucket) DO UPDATE
           SET marker = excluded.marker, fingerprint = excluded.fingerprint, created_at = excluded.created_at,
               recovery_point = excluded.recovery_point, status = NULL, headers = NULL, body = NULL,
               resource_id = NULL, lease_token = excluded.lease_token, lease_until = excluded.lease_until,
               runner = excluded.runner, request = excluded.request, phase_data = NULL,
               updated_at = excluded.updated_at, attempted_at = NULL, lookup_failures = 0,
               needs_review_at = NULL
         WHERE k.created_at <= $11::timestamptz
        RETURNING marker`;

/** Phases mode's statements for one schema. */
export interface PhaseSql {
  /** The live row of a key ($1 scope, $2 key, $3 oldest live created_at, $4 its bucket). */
  lookup: string;
  /** Look up and, when there is no live row, claim: one round trip ($1..$12). */
  lookupOrClaim: string;
  /** The same, committed without waiting for the WAL flush. */
  lookupOrClaimAsync: string;
  /** Insert the claim ($1..$11); with a boundary marker in bucket $12 too. */
  claim: string;
  claimWithMarker: string;
  takeLease: string;
  advance: string;
  advanceAsync: string;
  finish: string;
  lock: string;
  renew: string;
  release: string;
  attempt: string;
  lookupFailed: string;
}

function build(s: string): PhaseSql {
  const found = (where: string) => `SELECT ${ROW} FROM ${s}.keys WHERE ${where} ORDER BY bucket DESC LIMIT 1`;
  // A data-modifying CTE: the INSERT runs only when the lookup (same snapshot) found no live row.
  const lookupOrClaim = (asyncCommit: boolean) => `WITH found AS (${found(live("$2", "$3", "$11", "$12"))}),
         claimed AS (
           INSERT INTO ${s}.keys AS k ${COLUMNS}
           SELECT $1, ${CLAIMED}, false WHERE NOT EXISTS (SELECT 1 FROM found)
           ${REPLACE_EXPIRED}
         )
    SELECT f.*, f.bucket IS NOT NULL AS found, (SELECT count(*) FROM claimed)::int AS claimed
           ${asyncCommit ? ", set_config('synchronous_commit', 'off', true) AS async_commit" : ""}
      FROM (VALUES (1)) AS one (x) LEFT JOIN found f ON true`;
  const claim = (marker: boolean) =>
    `INSERT INTO ${s}.keys AS k ${COLUMNS}
     VALUES ($1, ${CLAIMED}, false)${marker ? `, ($12, ${CLAIMED}, true)` : ""}
     ${REPLACE_EXPIRED}`;

  const fence = "scope = $1 AND key = $2 AND bucket = $3 AND NOT marker AND lease_token = $4::uuid";
  const advance = `UPDATE ${s}.keys
        SET recovery_point = $5, phase_data = coalesce(phase_data, '{}'::jsonb) || $6::text::jsonb,
            lease_until = $7::timestamptz, updated_at = $8::timestamptz, attempted_at = NULL, lookup_failures = 0
      WHERE ${fence}`;
  return {
    lookup: found(live("$1", "$2", "$3", "$4")),
    lookupOrClaim: lookupOrClaim(false),
    // set_config(..., true) is local to this statement's own transaction and read at its commit: no
    // extra round trip, and the session's setting is left alone.
    lookupOrClaimAsync: lookupOrClaim(true),
    claim: claim(false),
    claimWithMarker: claim(true),
    // Free, or the holder's lease ran out (by the store's clock). Never a finished row, never one
    // waiting for a person. Returns what a resumed worker needs, the first request's input included.
    takeLease: `UPDATE ${s}.keys SET lease_token = $4::uuid, lease_until = $5::timestamptz, updated_at = $6::timestamptz
                 WHERE scope = $1 AND key = $2 AND bucket = $3 AND NOT marker
                   AND recovery_point <> 'done' AND needs_review_at IS NULL
                   AND (lease_until IS NULL OR lease_until <= $6::timestamptz)
             RETURNING recovery_point, phase_data, request, attempted_at, lookup_failures`,
    advance,
    // Only the row that passes the fence gets here, so only its commit is asynchronous.
    advanceAsync: `${advance} AND set_config('synchronous_commit', 'off', true) IS NOT NULL`,
    finish: `UPDATE ${s}.keys
        SET recovery_point = 'done', status = $5, headers = $6::text::jsonb, body = $7,
            phase_data = coalesce(phase_data, '{}'::jsonb) || $8::text::jsonb,
            lease_token = NULL, lease_until = NULL, updated_at = $9::timestamptz, attempted_at = NULL
      WHERE ${fence}`,
    lock: `SELECT 1 AS held FROM ${s}.keys WHERE ${fence} FOR UPDATE`,
    renew: `UPDATE ${s}.keys SET lease_until = $5::timestamptz WHERE ${fence}`,
    release: `UPDATE ${s}.keys SET lease_token = NULL, lease_until = NULL, updated_at = $5::timestamptz WHERE ${fence}`,
    // Before the external call of a phase whose provider does not dedup: "a call may have begun".
    attempt: `UPDATE ${s}.keys SET attempted_at = $5::timestamptz, updated_at = $5::timestamptz WHERE ${fence}`,
    lookupFailed: `UPDATE ${s}.keys SET lookup_failures = lookup_failures + 1, updated_at = $5::timestamptz
                    WHERE ${fence} RETURNING lookup_failures`,
  };
}

const cache = new Map<string, PhaseSql>();

/** The statements for a schema (built once per schema). */
export function phaseSql(schema: string): PhaseSql {
  let sql = cache.get(schema);
  if (!sql) {
    sql = build(schema);
    cache.set(schema, sql);
  }
  return sql;
}
