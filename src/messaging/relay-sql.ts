/**
 * The SQL of the outbox relay (see relay.ts for the timeline it serves), and the row it claims.
 */
import type { OutboxMessage } from "./types.ts";

export interface Row {
  id: string;
  topic: string;
  type: string;
  body: string;
  headers: Record<string, string> | string | null;
  aggregate_type: string | null;
  aggregate_id: string | null;
  attempts: number;
  created_at: Date | string;
}

/** The statements a relay runs, built once per schema and option set. */
export function statements(schema: string, ordered: boolean, filtered: boolean) {
  const t = `${schema}.outbox`;
  const returning = `RETURNING o.id::text AS id, o.topic, o.type, o.payload::text AS body, o.headers::text AS headers,
              o.aggregate_type, o.aggregate_id, o.attempts, o.created_at`;
  // The topic filter as `= ANY (ARRAY(...))`: Citus fails `IN (SELECT ...)` in the claim on its
  // reference table ("invalid input syntax for type uuid: PGCOPY"); both plan alike on PostgreSQL.
  const claimable = `o.published_at IS NULL AND o.parked_at IS NULL
        AND (o.locked_until IS NULL OR o.locked_until <= now())
        ${filtered ? "AND o.topic = ANY (ARRAY(SELECT jsonb_array_elements_text($3::text::jsonb)))" : ""}`;
  /*
   * Ordered: a run of events per aggregate (the relay publishes them in order, each once the one
   * before it is confirmed).
   *   held        aggregates with an unpublished event in flight, backing off or parked (few rows:
   *               the partial index outbox_held): none of their events may go now.
   *   candidates  the oldest claimable events of the other aggregates, row-locked.
   *   checked     an event is good if no unpublished event of its aggregate lies between it and
   *               the candidate just before it (or, for the first, before it at all). (A concurrent
   *               claim may hold an older one's row lock, which SKIP LOCKED passes over, or may
   *               have committed after this statement's snapshot.) Asked as "the aggregate's
   *               unpublished event just before it is the candidate before it (none for the first)":
   *               one backward step in outbox_aggregate_unpublished, as a plain index scan. (As a
   *               count, an outbox with statistics got bitmap scans that read the index entries of
   *               every event of the aggregate published since the last vacuum, each claim again:
   *               a plain scan marks them dead once.)
   *   the UPDATE  keeps the events of an aggregate up to its first that is not good.
   * The ids go to the UPDATE as an array, so it finds them by primary key.
   * On Citus (the outbox a reference table) the UPDATE on this selection fails ("invalid input syntax
   * for type uuid: PGCOPY", Citus 13.2), while the selection alone runs: there the claim is the
   * selection (`claimSelect`, rows locked FOR UPDATE) and then `claimIds`, in one transaction.
   */
  /*
   * Skipping the held aggregates: on PostgreSQL a hashed `NOT IN` on the aggregate as a jsonb pair
   * (exact, NULL types included), one hash probe per row; as a NOT EXISTS against the CTE, a fresh
   * outbox (no statistics yet) got a nested loop that sorted the held rows again for every unpublished
   * row (186 ms a claim for 10,000 waiting events and 20 aggregates in flight). Citus keeps the
   * NOT EXISTS: it fails `IN (SELECT ...)` in this statement (see the topic filter).
   */
  const notHeld = (citus: boolean) =>
    citus
      ? `NOT EXISTS (SELECT 1 FROM held h WHERE h.aggregate_id = o.aggregate_id
                          AND h.aggregate_type IS NOT DISTINCT FROM o.aggregate_type)`
      : `(o.aggregate_id IS NULL
             OR jsonb_build_array(o.aggregate_type, o.aggregate_id)
                NOT IN (SELECT jsonb_build_array(h.aggregate_type, h.aggregate_id) FROM held h))`;
  const ordering = (citus: boolean) => `
    WITH held AS (
      SELECT DISTINCT aggregate_type, aggregate_id FROM ${t}
      WHERE published_at IS NULL AND aggregate_id IS NOT NULL
        AND (parked_at IS NOT NULL OR locked_until IS NOT NULL)
        AND (parked_at IS NOT NULL OR locked_until > now())
    ), candidates AS (
      SELECT o.id, o.aggregate_type, o.aggregate_id FROM ${t} o
      WHERE ${claimable}
        AND ${notHeld(citus)}
      ORDER BY o.id
      LIMIT $1::int
      FOR UPDATE SKIP LOCKED
    ), ranked AS (
      SELECT id, aggregate_type, aggregate_id,
             lag(id) OVER (PARTITION BY aggregate_type, aggregate_id ORDER BY id) AS prev
      FROM candidates
    ), checked AS (
      SELECT r.id, r.aggregate_type, r.aggregate_id,
             CASE WHEN r.aggregate_id IS NULL THEN true
               ELSE (SELECT p.id FROM ${t} p
                 WHERE p.aggregate_id = r.aggregate_id AND p.published_at IS NULL
                   AND (p.aggregate_id, p.id) < (r.aggregate_id, r.id)
                   AND p.aggregate_type IS NOT DISTINCT FROM r.aggregate_type
                 ORDER BY p.aggregate_id DESC, p.id DESC LIMIT 1) IS NOT DISTINCT FROM r.prev
             END AS good
      FROM ranked r
    )
    , kept AS (
      SELECT k.id FROM (
        SELECT id, bool_and(good) OVER (PARTITION BY aggregate_type, aggregate_id ORDER BY id) AS kept
        FROM checked) k
      WHERE k.kept)`;
  const lock = `UPDATE ${t} o SET locked_until = now() + $2::int * interval '1 millisecond'`;
  const claim = ordered
    ? `${ordering(false)}
    ${lock}
    WHERE o.id = ANY (ARRAY(SELECT id FROM kept))
    ${returning}`
    : `
    WITH claimed AS (
      SELECT o.id FROM ${t} o
      WHERE ${claimable}
      ORDER BY o.id
      LIMIT $1::int
      FOR UPDATE SKIP LOCKED
    )
    UPDATE ${t} o SET locked_until = now() + $2::int * interval '1 millisecond'
    FROM claimed WHERE o.id = claimed.id
    ${returning}`;
  // $2 unused but typed, so both claims take the same parameters.
  const claimSelect = `${ordering(true)}
    SELECT id::text AS id, $2::int AS lease_ms FROM kept`;
  const claimIds = `${lock}
    WHERE o.id = ANY(string_to_array($1::text, ',')::uuid[]) AND o.published_at IS NULL
    ${returning}`;
  const published = `
    UPDATE ${t} SET published_at = now(), locked_until = NULL, last_error = NULL
    WHERE id = ANY(string_to_array($1::text, ',')::uuid[]) AND published_at IS NULL`;
  // $6: the jitter (0.5-1) of this group of failures, one draw for the group, so that the relay knows
  // when each row's backoff ends (and wakes then) from its attempts alone. Epoch arithmetic: Citus
  // refuses a STABLE function (timestamptz + interval) over a column in an UPDATE, and now() in a CASE.
  const failed = `
    UPDATE ${t} SET
      attempts = attempts + 1,
      last_error = $2::text,
      locked_until = to_timestamp(extract(epoch FROM now())::float8
                             + least($4::float8, $3::float8 * power(2, attempts)) * $6::float8 / 1000),
      parked_at = to_timestamp(extract(epoch FROM now())::float8 + CASE WHEN attempts + 1 >= $5::int THEN 0 END)
    WHERE id = ANY(string_to_array($1::text, ',')::uuid[]) AND published_at IS NULL
    RETURNING parked_at IS NOT NULL AS parked, attempts`;
  // The broker lost these (a connection cut, no ack in time): no attempt counted, back in $3 ms.
  const hold = `
    UPDATE ${t} SET locked_until = now() + $3::float8 * interval '1 millisecond', last_error = $2::text
    WHERE id = ANY(string_to_array($1::text, ',')::uuid[]) AND published_at IS NULL`;
  const release = `
    UPDATE ${t} SET locked_until = NULL, last_error = coalesce($2::text, last_error)
    WHERE id = ANY(string_to_array($1::text, ',')::uuid[]) AND published_at IS NULL`;
  const cleanup = `
    DELETE FROM ${t} WHERE id IN (
      SELECT id FROM ${t} WHERE published_at < now() - $1::float8 * interval '1 millisecond'
      ORDER BY published_at LIMIT $2::int)`;
  return { claim, claimSelect, claimIds, published, failed, hold, release, cleanup };
}

export function toMessage(r: Row): OutboxMessage {
  const headers =
    typeof r.headers === "string" ? (JSON.parse(r.headers) as Record<string, string>) : r.headers;
  return {
    id: r.id,
    topic: r.topic,
    type: r.type,
    body: r.body,
    headers: headers ?? {},
    aggregateType: r.aggregate_type,
    aggregateId: r.aggregate_id,
    attempts: Number(r.attempts),
    createdAt: r.created_at instanceof Date ? r.created_at : new Date(r.created_at),
  };
}
