/** Operating the outbox by hand: parked events, the relay's lag, requeue, counts by state. */
import type { Db, Tx } from "../core/db.ts";
import { schemaOf } from "../postgres/schema/migrate.ts";

/**
 * Put parked rows back in the queue (all of them, or those of `ids` / `topic` / `aggregateId`), attempts
 * reset. With per-aggregate ordering, requeueing an aggregate's parked event also frees the later events
 * it held back.
 */
export async function requeueParked(
  db: Db | Tx,
  options: { schema?: string; ids?: readonly string[]; topic?: string; aggregateId?: string } = {},
): Promise<number> {
  const schema = schemaOf(options);
  const { rowCount } = await db.query(
    `UPDATE ${schema}.outbox SET parked_at = NULL, attempts = 0, locked_until = NULL
     WHERE parked_at IS NOT NULL AND published_at IS NULL
       AND ($1::text IS NULL OR id = ANY(string_to_array($1::text, ',')::uuid[]))
       AND ($2::text IS NULL OR topic = $2::text)
       AND ($3::text IS NULL OR aggregate_id = $3::text)`,
    [options.ids ? options.ids.join(",") : null, options.topic ?? null, options.aggregateId ?? null],
  );
  return rowCount;
}

/** One parked outbox event, as a person looks at it. */
export interface ParkedEvent {
  /** The event id (the message id on the broker). */
  id: string;
  /** Where it was to be published. */
  topic: string;
  /** What happened, e.g. `"payment.succeeded"`. */
  type: string;
  /** The aggregate's type; null when none. */
  aggregateType: string | null;
  /** The aggregate's id; null when none. */
  aggregateId: string | null;
  /** Failed publishes. */
  attempts: number;
  /** The last publish's error. */
  lastError: string | null;
  /** When it was written. */
  createdAt: Date;
  /** When it was parked. */
  parkedAt: Date;
  /** Later unpublished events of the same aggregate it holds back (per-aggregate ordering). */
  heldBack: number;
  /** The event's body. */
  payload: unknown;
}

/** The parked events, oldest first (at most `limit`, default 100). */
export async function parkedEvents(
  db: Db,
  options: { schema?: string; limit?: number } = {},
): Promise<ParkedEvent[]> {
  const s = schemaOf(options);
  const { rows } = await db.query<Record<string, unknown>>(
    `SELECT o.id::text AS id, o.topic, o.type, o.aggregate_type, o.aggregate_id, o.attempts, o.last_error,
            o.created_at, o.parked_at, o.payload::text AS payload,
            (SELECT count(*)::int FROM ${s}.outbox l WHERE o.aggregate_id IS NOT NULL
                AND l.aggregate_id = o.aggregate_id AND l.published_at IS NULL AND l.id > o.id) AS held_back
       FROM ${s}.outbox o WHERE o.parked_at IS NOT NULL AND o.published_at IS NULL
      ORDER BY o.parked_at, o.id LIMIT $1`,
    [Math.max(1, Math.floor(options.limit ?? 100))],
  );
  return rows.map((r) => ({
    id: String(r.id),
    topic: String(r.topic),
    type: String(r.type),
    aggregateType: r.aggregate_type == null ? null : String(r.aggregate_type),
    aggregateId: r.aggregate_id == null ? null : String(r.aggregate_id),
    attempts: Number(r.attempts),
    lastError: r.last_error == null ? null : String(r.last_error),
    createdAt: new Date(r.created_at as string),
    parkedAt: new Date(r.parked_at as string),
    heldBack: Number(r.held_back),
    payload: JSON.parse(String(r.payload)),
  }));
}

/** How far the relay is behind: age in seconds of the oldest unpublished event (0 when none). */
export async function outboxLag(db: Db, options: { schema?: string } = {}): Promise<number> {
  const s = schemaOf(options);
  const { rows } = await db.query<{ lag: number | null }>(
    `SELECT extract(epoch FROM now() - min(created_at))::float8 AS lag FROM ${s}.outbox
      WHERE published_at IS NULL AND parked_at IS NULL`,
  );
  return Math.max(0, Number(rows[0]?.lag ?? 0));
}

/** Counts of the outbox's rows by state, for dashboards and tests. */
export async function outboxCounts(
  db: Db,
  options: { schema?: string } = {},
): Promise<{ pending: number; published: number; parked: number }> {
  const schema = schemaOf(options);
  const { rows } = await db.query<{ pending: string; published: string; parked: string }>(
    `SELECT count(*) FILTER (WHERE published_at IS NULL AND parked_at IS NULL) AS pending,
            count(*) FILTER (WHERE published_at IS NOT NULL) AS published,
            count(*) FILTER (WHERE parked_at IS NOT NULL AND published_at IS NULL) AS parked
     FROM ${schema}.outbox`,
  );
  const r = rows[0]!;
  return { pending: Number(r.pending), published: Number(r.published), parked: Number(r.parked) };
}
