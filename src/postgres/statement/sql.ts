/**
 * Single-statement mode's SQL: the claim of the key, the route's work and the saved reply in ONE
 * autocommitted statement (the "hand-cte" shape of bench/compare/hand.ts, on idem's keys table).
 *
 *   WITH idem_live  whether the key has a live row, read with the statement's snapshot (as atomic
 *                   mode's lookup)
 *        idem_gate  where a row made now goes (bucket, boundary marker due?), and, only when no live
 *                   row was seen, pg_try_advisory_xact_lock on the key's lock (atomic mode's lock id)
 *        idem_claim one row when the lock was taken and no live row was seen; none otherwise (with
 *                   the claim's id, made here). The route's statement reads its input FROM
 *                   idem_claim, so it does nothing when the key is taken (a data-modifying CTE
 *                   always runs: it must gate itself)
 *        work       the route's statement (INSERT/UPDATE/DELETE ... RETURNING), gated on idem_claim
 *        idem_reply the saved reply's body, built in SQL from the first row the work returned
 *        idem_put   the finished key row (and a boundary marker), replacing an expired row in place
 *        idem_dup   the same rows again, plain INSERT, for those `idem_put` did not write: a live row
 *                   in their place (a concurrent duplicate that committed after this statement's
 *                   snapshot) fails the whole statement with 23505, the work rolled back with it
 *   SELECT what happened: a live row was seen (its answer is read apart: a replay, 422, in flight),
 *          or the saved row (its body as text), or "busy"
 *
 * That is the full statement (`statementSql`). Most requests are sent a smaller one first
 * (`commonStatementSql`): the same gate and work, the lookup in partitions named as constants, the key
 * row as a plain INSERT, no marker; it declines when a marker is due (or its partitions miss one), and
 * fails on an expired row in its place, and the full one is sent then.
 *
 * Why the marker: the unique index is per partition, and the statement's snapshot cannot see a
 * duplicate that committed after it began (the lock alone does not help: taking it inside the
 * statement does not refresh the snapshot). Statements whose `now()` fall in the first
 * `boundaryOverlapMs` of a partition also write a marker row into the previous partition, as phases
 * mode's claims do (sql/0001): two duplicates on either side of a boundary then meet on one unique
 * index, and the later one fails with 23505. The lock keeps that race to the microseconds between a
 * statement's snapshot and its lock, and turns every other concurrent duplicate into a "busy" answer
 * that did no work and waited for nothing.
 *
 * Parameters: the route's own $1..$n first, then ours: $n+1 scope, $n+2 key, $n+3 fingerprint,
 * $n+4 lock id, $n+5 status, $n+6 saved headers (JSON text).
 *
 * The row it returns is narrow on purpose (two columns, no timestamp, no bytea): node-postgres
 * describes and parses every column of every answer (building and copying an object per description),
 * and this one answers every request of the route; so the small values come as one JSON array, and
 * the saved body as text beside it (as JSON it would be escaped and unescaped again).
 */
import { DbTime } from "../keys/db-time.ts";
import { liveRow } from "../keys/live.ts";

/** What the statement returns (always one row): `found` (`StatementFound`) and the saved body. */
export interface StatementRow {
  found: StatementFound | string;
  /** This statement's saved body, or null when it saved nothing. */
  saved_body: string | null;
}

/**
 * [locked, live, saved status, saved ms, saved claim id, ungated, declined]: the advisory lock was taken
 * (false: a live row was seen, or the key is held by another statement, or the statement declined); a
 * live row of the key was seen (its answer is read with the lookup); this statement's saved key row, its
 * status (null: nothing saved), creation (epoch ms) and claim; always null (a statement that returned
 * rows without reading its claim fails on it, 22P02); and whether the common statement declined (a
 * boundary marker is due, or its partitions miss one: the full statement answers; always false from the
 * full statement).
 */
export type StatementFound = [
  locked: boolean,
  live: boolean,
  savedStatus: number | null,
  savedMs: number | null,
  savedClaimId: string | null,
  ungated: null,
  declined: boolean,
];

/** The table-side constants a statement is built for. */
export interface StatementTable {
  schema: string;
  dbTime: DbTime;
  boundaryOverlapMs: number;
}

/** The name the route's statement reads its claim from. */
export const CLAIM_RELATION = "idem_claim";

/** The pieces both statements share, for the route's `sql` with `n` parameters of its own. */
function partsOf(table: StatementTable, n: number) {
  const t = table.dbTime;
  const p = (i: number) => `$${n + i}`;
  const [scope, key, fp, lockId, status, headers] = [1, 2, 3, 4, 5, 6].map(p);
  const overlap = Math.trunc(table.boundaryOverlapMs);
  const width = Math.trunc(t.widthMs);
  return {
    scope,
    key,
    fp,
    lockId,
    status,
    headers,
    /**
     * A live row of the key (keys/live.ts) in `buckets`: every partition a live row can be in, by the
     * database's clock (`DbTime.window`), or those named as constants (PostgreSQL prunes the other
     * partitions when it plans the statement).
     */
    liveIn: (buckets: string) => liveRow(t, `${scope}::text`, `${key}::text`, buckets),
    /** Whether a row made now is in the first `boundaryOverlapMs` of its partition (a marker is due). */
    markerDue: `extract(epoch FROM ${t.now})::float8 * 1000 - ${t.bucket}::float8 * ${width} < ${overlap}`,
    /**
     * The statement's answer when it returned rows without reading its claim: an error (22P02) that
     * rolls its work back (`concat` is stable, so the cast is not folded into an error at planning).
     */
    ungated: (locked: string) => `CASE WHEN NOT ${locked} AND EXISTS (SELECT 1 FROM work)
                THEN concat('idem: the single statement ran without reading FROM ${CLAIM_RELATION}', '')::int END`,
  };
}

/**
 * The common case's statement: the key row alone, as a plain INSERT into the current partition, and the
 * live lookup in the partitions `range` names as constants (from this process's estimate of the
 * database's time, `DbTime.rangeAround`), so that PostgreSQL prunes the others once, when it plans the
 * statement, instead of at every execution.
 *
 * It declines (no lock, no work; `found` says `declined`) when a row made now needs a boundary marker,
 * or when `range` misses a partition the database's clock says a live row may be in: the store then
 * sends `statementSql`'s text, which reads by that clock alone and writes the marker. Its plain INSERT
 * meets any row of the key in the current partition: a live one is a duplicate that committed after this
 * statement's snapshot (23505, as the full statement's `idem_dup`); an expired one (only when the
 * retention is shorter than a partition) fails it too, and the store sends the full statement, which
 * replaces that row in place.
 *
 * Why a second text: PostgreSQL builds the executor state of a prepared statement's whole plan at every
 * execution (and sets up the pruning of a partitioned scan whose bounds are expressions), so the plan's
 * size is paid per request. This text leaves out the expired row's upsert and the duplicate's second
 * INSERT, and names its partitions: about a third fewer instructions per execution than the full
 * statement (docs/decisions/named-partitions.md).
 */
export function commonStatementSql(
  table: StatementTable,
  sql: string,
  n: number,
  bodyExpr: string,
  range: { lo: number; hi: number },
): string {
  const s = table.schema;
  const t = table.dbTime;
  const q = partsOf(table, n);
  return `WITH idem_gate AS MATERIALIZED (
    SELECT ${t.bucket} AS bucket, (${q.markerDue}) OR NOT ${t.covers(range)} AS declined,
           EXISTS (SELECT 1 FROM ${s}.keys WHERE ${q.liveIn(DbTime.named(range))}) AS live
  ),
  ${CLAIM_RELATION} AS MATERIALIZED (
    SELECT ${q.scope}::text AS scope, ${q.key}::text AS key, gen_random_uuid() AS claim_id
      FROM idem_gate
     WHERE CASE WHEN live OR declined THEN false ELSE pg_try_advisory_xact_lock(${q.lockId}::bigint) END
  ),
  work AS (
${sql}
  ),
  idem_reply AS MATERIALIZED (
    SELECT (${bodyExpr})::text AS body FROM work LIMIT 1
  ),
  idem_put AS (
    INSERT INTO ${s}.keys (bucket, scope, key, fingerprint, created_at, recovery_point, status, headers, body,
                           claim_id)
    SELECT g.bucket, ${q.scope}, ${q.key}, ${q.fp}, ${t.now}, 'done', ${q.status}::int, ${q.headers}::text::jsonb,
           convert_to(r.body, 'UTF8'), c.claim_id
      FROM idem_gate g, ${CLAIM_RELATION} c, idem_reply r
    RETURNING status, created_at, claim_id::text AS claim_id
  )
  SELECT json_build_array(c.key IS NOT NULL, g.live, p.status, (extract(epoch FROM p.created_at) * 1000)::float8,
           p.claim_id, ${q.ungated("(c.key IS NOT NULL)")}, g.declined) AS found,
         CASE WHEN p.status IS NOT NULL THEN (SELECT body FROM idem_reply) END AS saved_body
    FROM idem_gate g LEFT JOIN ${CLAIM_RELATION} c ON true LEFT JOIN idem_put p ON true`;
}

/**
 * The whole statement for the route's `sql` (with `n` parameters of its own) and its reply body
 * expression (over one row of `work`): with the boundary marker when one is due, and the upsert of an
 * expired row of the key in the current partition.
 */
export function statementSql(table: StatementTable, sql: string, n: number, bodyExpr: string): string {
  const s = table.schema;
  const t = table.dbTime;
  const q = partsOf(table, n);
  const expired = t.expiredAgainst("k.created_at", "excluded.created_at");
  return `WITH idem_live AS MATERIALIZED (
    SELECT 1 FROM ${s}.keys WHERE ${q.liveIn(t.window)}
     ORDER BY bucket DESC LIMIT 1
  ),
  idem_gate AS MATERIALIZED (
    SELECT ${t.bucket} AS bucket, ${q.markerDue} AS marker,
           CASE WHEN EXISTS (SELECT 1 FROM idem_live) THEN false
                ELSE pg_try_advisory_xact_lock(${q.lockId}::bigint) END AS locked
  ),
  ${CLAIM_RELATION} AS MATERIALIZED (
    SELECT ${q.scope}::text AS scope, ${q.key}::text AS key, gen_random_uuid() AS claim_id
      FROM idem_gate WHERE locked
  ),
  work AS (
${sql}
  ),
  idem_reply AS MATERIALIZED (
    SELECT (${bodyExpr})::text AS body FROM work LIMIT 1
  ),
  idem_want AS MATERIALIZED (
    SELECT g.bucket - m.back AS bucket, m.back = 1 AS marker, r.body, c.claim_id
      FROM idem_gate g, ${CLAIM_RELATION} c, idem_reply r, (VALUES (0), (1)) AS m (back)
     WHERE m.back = 0 OR g.marker
  ),
  idem_put AS (
    INSERT INTO ${s}.keys AS k (bucket, scope, key, marker, fingerprint, created_at, recovery_point, status,
                                headers, body, claim_id)
    SELECT w.bucket, ${q.scope}, ${q.key}, w.marker, ${q.fp}, ${t.now}, 'done',
           CASE WHEN w.marker THEN NULL ELSE ${q.status}::int END,
           CASE WHEN w.marker THEN NULL ELSE ${q.headers}::text::jsonb END,
           CASE WHEN w.marker THEN NULL ELSE convert_to(w.body, 'UTF8') END, w.claim_id
      FROM idem_want w
    ON CONFLICT (scope, key, bucket) DO UPDATE
       SET marker = excluded.marker, fingerprint = excluded.fingerprint, created_at = excluded.created_at,
           recovery_point = 'done', status = excluded.status, headers = excluded.headers, body = excluded.body,
           resource_id = NULL, lease_token = NULL, lease_until = NULL, runner = NULL, request = NULL,
           phase_data = NULL, updated_at = NULL, attempted_at = NULL, lookup_failures = 0,
           needs_review_at = NULL, claim_id = excluded.claim_id
     WHERE ${expired}
    RETURNING bucket, marker, status, created_at, claim_id::text AS claim_id
  ),
  idem_dup AS (
    INSERT INTO ${s}.keys (bucket, scope, key, marker, fingerprint, created_at)
    SELECT w.bucket, ${q.scope}, ${q.key}, w.marker, ${q.fp}, ${t.now} FROM idem_want w
     WHERE NOT EXISTS (SELECT 1 FROM idem_put p WHERE p.bucket = w.bucket)
    RETURNING 1
  )
  SELECT json_build_array(g.locked, EXISTS (SELECT 1 FROM idem_live), p.status,
           (extract(epoch FROM p.created_at) * 1000)::float8, p.claim_id, ${q.ungated("g.locked")},
           false) AS found,
         CASE WHEN p.status IS NOT NULL THEN (SELECT body FROM idem_reply) END AS saved_body
    FROM idem_gate g LEFT JOIN idem_put p ON NOT p.marker`;
}

/** The route's statement alone, for a request without a key (`required: false`): no claim is saved. */
export function unkeyedSql(sql: string, bodyExpr: string): string {
  return `WITH ${CLAIM_RELATION} AS MATERIALIZED (
    SELECT NULL::text AS scope, NULL::text AS key, gen_random_uuid() AS claim_id
  ),
  work AS (
${sql}
  )
  SELECT (${bodyExpr})::text AS body FROM work LIMIT 1`;
}
