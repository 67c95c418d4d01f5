/** Operating the outbox by hand: requeue parked events, count rows by state. */
import type { Db } from "../core/db.ts";
import { schemaOf } from "../postgres/migrate.ts";

/** Put parked rows back in the queue (all of them, or those of `ids` / `topic`), attempts reset. */
export async function requeueParked(
  db: Db,
  options: { schema?: string; ids?: readonly string[]; topic?: string } = {},
): Promise<number> {
  const schema = schemaOf(options);
  const { rowCount } = await db.query(
    `UPDATE ${schema}.outbox SET parked_at = NULL, attempts = 0, locked_until = NULL
     WHERE parked_at IS NOT NULL AND published_at IS NULL
       AND ($1::text IS NULL OR id = ANY(string_to_array($1::text, ',')::uuid[]))
       AND ($2::text IS NULL OR topic = $2::text)`,
    [options.ids ? options.ids.join(",") : null, options.topic ?? null],
  );
  return rowCount;
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
