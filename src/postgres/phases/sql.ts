/**
 * Phases mode's SQL, per keys table. Every statement is written out whole (no string surgery): the few
 * variants (a boundary marker, an asynchronous commit) are composed from named parts.
 *
 * Time is the database's (db-time.ts): every expiry, lease and placement below is computed from `NOW`
 * inside the statement, so workers whose clocks disagree still agree on who holds a key. The store's
 * constants (its time shift, partition width, retention, boundary overlap) are literals in the text;
 * what varies per call is a parameter.
 *
 * The claim statements take: $1 scope, $2 key, $3 fingerprint, $4 first recovery point, $5 lease token,
 * $6 lease length in ms, $7 runner name, $8 input (JSON text), $9 the claim id (a UUIDv7 made by the
 * process: see claim.ts). The fenced statements take: $1 scope, $2 key, $3 bucket, $4 our lease token;
 * every write they make ends in `AND lease_token = $4`, so a worker whose lease was taken over changes
 * nothing. They are built per bucket (`fencedSql`), which they also name as a literal.
 *
 * Each statement that changes a key also appends its event to the key's history (history.ts) with a
 * data-modifying CTE: a fenced write is then `WITH u AS (UPDATE ...) INSERT INTO key_events ...`, whose
 * count is the UPDATE's (1: done; 0: the fence refused it).
 */
import { type BucketRange, DbTime } from "../keys/db-time.ts";
import { liveRow } from "../keys/live.ts";
import type { KeyRow } from "../keys/row.ts";
import type { KeyTable } from "../keys/table.ts";
import { appendEvents } from "./history.ts";

/** A key row as phases mode reads it. */
export interface PhaseRow extends KeyRow {
  lease_token: string | null;
  lease_until: Date | null;
  /** Whole seconds left on a live lease, by the database's clock (0: free or expired). */
  lease_left_s: number;
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

/** Phases mode's statements for one keys table that find or claim a key: no row is known yet. */
export interface PhaseSql {
  /** The live row of a key ($1 scope, $2 key). */
  lookup: string;
  /**
   * Look up and, when there is no live row and no boundary marker is due, claim: one round trip
   * ($1..$9). Returns the live row (`found`), or what was claimed (`claimed_*`), or `needs_marker`.
   */
  lookupOrClaim: string;
  /** The same, committed without waiting for the WAL flush. */
  lookupOrClaimAsync: string;
  /**
   * `lookupOrClaim` (or its asynchronous form) reading the partitions named from this process's
   * estimate of the database's time (`estimatedMs`), as atomic mode's lookups do: it also returns
   * `covered`, and claims nothing when false (the named partitions miss one the database's clock says
   * a live row may be in): the caller then runs the plain form.
   */
  lookupOrClaimAround(estimatedMs: number, asyncCommit: boolean): string;
  /**
   * Insert the claim ($1..$9), with a boundary marker in the previous bucket when one is due and $10 is
   * true. Run in a transaction: `inserted` must be 2 with a marker, else 1.
   */
  claim: string;
}

/**
 * The statements on one key row, whose partition (bucket) is known: taking its lease, and the fenced
 * writes of the worker that holds it.
 */
export interface FencedSql {
  takeLease: string;
  advance: string;
  advanceAsync: string;
  finish: string;
  lock: string;
  renew: string;
  release: string;
  /** `release`, recording that the worker's external call may have reached the other system. */
  releaseAfterCall: string;
  attempt: string;
  lookupFailed: string;
}

const COLUMNS = `(bucket, scope, key, fingerprint, created_at, recovery_point, lease_token, lease_until, runner,
                  request, updated_at, claim_id, marker)`;

function build(s: string, t: DbTime, overlapMs: number): PhaseSql {
  const NOW = t.now;
  const leaseUntil = (param: string) => DbTime.plusMs(NOW, param);
  const ROW = `bucket, fingerprint, created_at, recovery_point, status, headers, body, claim_id::text AS claim_id,
             lease_token::text AS lease_token, lease_until, phase_data, request, attempted_at, lookup_failures,
             needs_review_at,
             CASE WHEN lease_until > ${NOW} THEN ceil(extract(epoch FROM lease_until - ${NOW}))::int ELSE 0 END
               AS lease_left_s`;
  /**
   * The live (unexpired) row of (scope, key): created after the oldest live instant, in a live bucket,
   * not in the partitions made ahead (no row goes there: db-time.ts, LOOKUP_AHEAD_MS), as atomic mode
   * reads it. On a daily-partitioned table, 3 buffers for a miss instead of 7.
   */
  const live = (scope: string, key: string, buckets = t.window) => liveRow(t, scope, key, buckets);
  const found = (where: string) => `SELECT ${ROW} FROM ${s}.keys WHERE ${where} ORDER BY bucket DESC LIMIT 1`;
  /**
   * Where a claim made now goes, and whether it also marks the previous bucket: claims in the first
   * `overlapMs` of a partition do, so that two first claims racing across a partition boundary meet
   * on one unique index.
   */
  const place = `SELECT ${t.bucket} AS bucket,
         extract(epoch FROM ${NOW})::float8 * 1000 - ${t.bucket}::float8 * ${Math.trunc(t.widthMs)} < ${Math.trunc(overlapMs)}
           AS marker`;
  const claimed = `$1, $2, $3, ${NOW}, $4, $5::uuid, ${leaseUntil("$6")}, $7, $8::text::jsonb, ${NOW}, $9::uuid`;
  /**
   * A row already under this (scope, key, bucket) blocks the claim, unless it has expired: with a
   * retention shorter than a partition, a key reused after its expiry lands on its old row's primary
   * key, and "after expiry the key is new" means that row is replaced, whole, with a new claim id.
   */
  const replaceExpired = `ON CONFLICT (scope, key, bucket) DO UPDATE
           SET marker = excluded.marker, fingerprint = excluded.fingerprint, created_at = excluded.created_at,
               recovery_point = excluded.recovery_point, status = NULL, headers = NULL, body = NULL,
               resource_id = NULL, lease_token = excluded.lease_token, lease_until = excluded.lease_until,
               runner = excluded.runner, request = excluded.request, phase_data = NULL,
               updated_at = excluded.updated_at, attempted_at = NULL, lookup_failures = 0,
               needs_review_at = NULL, claim_id = excluded.claim_id
         WHERE ${t.expiredAgainst("k.created_at", "excluded.created_at")}`;
  const claimedCols = "bucket, created_at, claim_id::text AS claim_id, marker";
  const logged = (from: string, kind: string, token: string, details: string) =>
    appended(s, t, from, kind, token, details);
  const claimEvent = (from: string) =>
    `history AS (${logged(`${from} WHERE NOT marker`, "'claimed'", "$5::uuid", "jsonb_build_object('point', $4::text, 'runner', $7::text)")})`;
  // A data-modifying CTE: the INSERT runs only when the lookup (same snapshot) found no live row and
  // no boundary marker is due (that claim takes `claim`, in a transaction).
  // ON CONFLICT DO NOTHING, not replaceExpired: DO UPDATE locks the conflicting row even when its WHERE
  // is false, so a burst of duplicates queued one by one on the first one's row (on Citus each for a
  // remote commit). An expired row found here falls through to `claim`, which replaces it.
  //
  // With `range`, the lookup reads the partitions named (`DbTime.rangeAround`): PostgreSQL prunes the
  // others when it plans the statement instead of working out two bucket numbers at every execution
  // (docs/decisions/named-partitions.md).
  // The INSERT then also waits for `covered`: a lookup that may have missed a live row must not claim
  // its key.
  const lookupOrClaim = (asyncCommit: boolean, range?: BucketRange) => `WITH found AS (${found(
    live("$1", "$2", range ? DbTime.named(range) : t.window),
  )}),
         place AS (${range ? `SELECT *, ${t.covers(range)} AS covered FROM (${place}) p0` : place}),
         claimed AS (
           INSERT INTO ${s}.keys AS k ${COLUMNS}
           SELECT p.bucket, ${claimed}, false FROM place p
            WHERE NOT p.marker AND NOT EXISTS (SELECT 1 FROM found)${range ? " AND p.covered" : ""}
           ON CONFLICT DO NOTHING
           RETURNING ${claimedCols}
         ),
         ${claimEvent("claimed")}
    SELECT f.*, f.bucket IS NOT NULL AS found, p.marker AS needs_marker, c.bucket AS claimed_bucket,
           c.created_at AS claimed_at, c.claim_id AS claimed_id${range ? ", p.covered" : ""}
           ${asyncCommit ? ", set_config('synchronous_commit', 'off', true) AS async_commit" : ""}
      FROM place p LEFT JOIN found f ON true LEFT JOIN claimed c ON true`;
  const around = t.aroundEstimate((range) => ({
    sync: lookupOrClaim(false, range),
    async: lookupOrClaim(true, range),
  }));

  return {
    lookup: found(live("$1", "$2")),
    lookupOrClaim: lookupOrClaim(false),
    // set_config(..., true) is local to this statement's own transaction and read at its commit: no
    // extra round trip, and the session's setting is left alone.
    lookupOrClaimAsync: lookupOrClaim(true),
    lookupOrClaimAround(estimatedMs, asyncCommit) {
      const texts = around(estimatedMs);
      return asyncCommit ? texts.async : texts.sync;
    },
    claim: `WITH place AS (SELECT bucket, marker AND $10::boolean AS marker FROM (${place}) p0),
         ins AS (
           INSERT INTO ${s}.keys AS k ${COLUMNS}
           SELECT p.bucket - m.back, ${claimed}, m.back = 1
             FROM place p, (VALUES (0), (1)) AS m (back) WHERE m.back = 0 OR p.marker
           ${replaceExpired}
           RETURNING ${claimedCols}
         ),
         ${claimEvent("ins")}
    SELECT (SELECT count(*) FROM ins)::int AS inserted, p.marker AS wanted_marker, i.bucket, i.created_at,
           i.claim_id
      FROM place p LEFT JOIN ins i ON NOT i.marker`,
  };
}

/** The statements on the key row in `bucket`: its lease and the fenced writes. */
function buildFenced(s: string, t: DbTime, bucket: number): FencedSql {
  const NOW = t.now;
  const leaseUntil = (param: string) => DbTime.plusMs(NOW, param);
  const logged = (from: string, kind: string, token: string, details: string) =>
    appended(s, t, from, kind, token, details);
  // The row's bucket twice: as $3, and as a literal that lets PostgreSQL prune the other partitions
  // when it plans the statement, so that a prepared statement keeps one generic plan per connection.
  // With $3 alone, it planned the statement again at every call to prune by the value
  // (docs/decisions/named-partitions.md).
  const row = `scope = $1 AND key = $2 AND bucket = $3 AND bucket = ${Math.trunc(bucket)} AND NOT marker`;
  const fence = `${row} AND lease_token = $4::uuid`;
  /** A fenced UPDATE that appends its event to the key's history. */
  const fenced = (update: string, kind: string, details: string) =>
    `WITH u AS (${update} WHERE ${fence} RETURNING bucket, claim_id, recovery_point)
     ${logged("u", kind, "$4::uuid", details)}`;
  const advance = `UPDATE ${s}.keys
        SET recovery_point = $5, ${mergePhaseData("$6")},
            lease_until = ${leaseUntil("$7")}, updated_at = ${NOW}, attempted_at = NULL, lookup_failures = 0`;
  const pointEvent = "jsonb_build_object('point', recovery_point)";
  return {
    // Free, or the holder's lease ran out, by the database's clock: two workers whose own clocks
    // disagree by hours still agree here. Never a finished row, never one waiting for a person.
    // Returns what a resumed worker needs, the first request's input included.
    // The token it replaces (read locked, in the same statement) tells a takeover from a free lease.
    takeLease: `WITH taken AS (
           UPDATE ${s}.keys SET lease_token = $4::uuid, lease_until = ${leaseUntil("$5")}, updated_at = ${NOW}
             FROM (SELECT lease_token AS replaced FROM ${s}.keys WHERE ${row} FOR UPDATE) p
                 WHERE ${row}
                   AND recovery_point <> 'done' AND needs_review_at IS NULL
                   AND (lease_until IS NULL OR lease_until <= ${NOW})
             RETURNING recovery_point, phase_data, request, attempted_at, lookup_failures, bucket, claim_id,
                       p.replaced
         ),
         history AS (${logged("taken", "CASE WHEN replaced IS NULL THEN 'lease-taken' ELSE 'takeover' END", "$4::uuid", "jsonb_build_object('point', recovery_point, 'replaced', replaced)")})
    SELECT recovery_point, phase_data, request, attempted_at, lookup_failures FROM taken`,
    advance: fenced(advance, "'recovery-point'", pointEvent),
    // Only the row that passes the fence gets here, so only its commit is asynchronous. set_config runs
    // in the SELECT over the UPDATE's rows: Citus refuses a VOLATILE function anywhere in a modification
    // of a distributed table (WHERE, SET, RETURNING). One row per row updated (the runner counts rows).
    advanceAsync: `WITH u AS (${advance} WHERE ${fence} RETURNING bucket, claim_id, recovery_point),
         history AS (${logged("u", "'recovery-point'", "$4::uuid", pointEvent)})
    SELECT set_config('synchronous_commit', 'off', true) AS async_commit FROM u`,
    finish: fenced(
      `UPDATE ${s}.keys
        SET recovery_point = 'done', status = $5, headers = $6::text::jsonb, body = $7,
            ${mergePhaseData("$8")},
            lease_token = NULL, lease_until = NULL, updated_at = ${NOW}, attempted_at = NULL`,
      "'saved'",
      "jsonb_build_object('status', $5::int)",
    ),
    lock: `SELECT 1 AS held FROM ${s}.keys WHERE ${fence} FOR UPDATE`,
    renew: `UPDATE ${s}.keys SET lease_until = ${leaseUntil("$5")} WHERE ${fence}`,
    release: fenced(
      `UPDATE ${s}.keys SET lease_token = NULL, lease_until = NULL, updated_at = ${NOW}`,
      "'lease-released'",
      pointEvent,
    ),
    releaseAfterCall: fenced(
      `UPDATE ${s}.keys SET lease_token = NULL, lease_until = NULL, updated_at = ${NOW}`,
      "'lease-released'",
      "jsonb_build_object('point', recovery_point, 'called', true)",
    ),
    // Before the external call of a phase whose provider does not dedup: "a call may have begun".
    attempt: fenced(
      `UPDATE ${s}.keys SET attempted_at = ${NOW}, updated_at = ${NOW}`,
      "'call-begun'",
      pointEvent,
    ),
    lookupFailed: `WITH u AS (UPDATE ${s}.keys SET lookup_failures = lookup_failures + 1, updated_at = ${NOW}
                    WHERE ${fence} RETURNING bucket, claim_id, recovery_point, lookup_failures),
         history AS (${logged("u", "'lookup'", "$4::uuid", "jsonb_build_object('point', recovery_point, 'found', 'unknown', 'failures', lookup_failures)")})
    SELECT lookup_failures FROM u`,
  };
}

/** Append an event per row of `from` (its bucket and claim_id) to the history, at the database's now. */
function appended(s: string, t: DbTime, from: string, kind: string, token: string, details: string): string {
  return `${appendEvents(s)} SELECT bucket, claim_id::uuid, $1, $2, ${t.now}, ${kind}, ${token}, ${details} FROM ${from}`;
}

/**
 * Built once per configuration (and bucket): `make` runs on a miss. Bounded: tests move the time shift
 * often, a service uses one configuration and sees a new bucket once per partition width.
 */
function cached<T>(cache: Map<string, T>, id: string, make: () => T): T {
  let sql = cache.get(id);
  if (!sql) {
    if (cache.size > 200) cache.clear();
    sql = make();
    cache.set(id, sql);
  }
  return sql;
}

const claimCache = new Map<string, PhaseSql>();
const fencedCache = new Map<string, FencedSql>();

/** The statements for a keys table at its current time shift. */
export function phaseSql(table: KeyTable): PhaseSql {
  const { schema, dbTime, boundaryOverlapMs } = table;
  return cached(claimCache, `${schema}/${dbTime.key}/${boundaryOverlapMs}`, () =>
    build(schema, dbTime, boundaryOverlapMs),
  );
}

/** The statements on one key row of a keys table, in partition `bucket`. */
export function fencedSql(table: KeyTable, bucket: number): FencedSql {
  const { schema, dbTime } = table;
  return cached(fencedCache, `${schema}/${dbTime.key}/${bucket}`, () => buildFenced(schema, dbTime, bucket));
}

/**
 * The SET of a phase's data (`phaseDataParam`): an object in clear is merged into the row's, a sealed
 * value (a JSON string: the whole data) replaces it.
 */
export function mergePhaseData(param: string): string {
  return `phase_data = CASE WHEN jsonb_typeof(${param}::text::jsonb) = 'object'
            THEN coalesce(phase_data, '{}'::jsonb) || ${param}::text::jsonb ELSE ${param}::text::jsonb END`;
}
