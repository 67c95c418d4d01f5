/**
 * Shared by the ordered-backlog tests (drain speed, clustered brokers): a backlog of events spread over
 * aggregates, a batch effect that logs the order in which each aggregate's events were applied, and
 * the checks users care about (each applied once, in order per aggregate).
 */
import type { Db, Tx } from "../../src/postgres/db.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";

/** The table the ordered effect writes to (`n` is the order of application). */
export async function prepareOrdered(db: Db): Promise<void> {
  await db.exec(`CREATE TABLE IF NOT EXISTS ordered_effects (
    n bigserial PRIMARY KEY, consumer text NOT NULL, message_id text NOT NULL, agg text NOT NULL, seq int NOT NULL)`);
}

/**
 * Write `n` events over `aggregates` aggregates, round robin (event i belongs to aggregate i mod
 * `aggregates` and is its `floor(i / aggregates)`-th), 500 per transaction. No relay is running, so
 * they wait as a backlog.
 */
export async function writeBacklog(db: Db, topic: string, n: number, aggregates: number): Promise<void> {
  for (let done = 0; done < n; done += 500) {
    await db.transaction(async (tx) => {
      for (let i = done; i < Math.min(n, done + 500); i++) {
        const agg = `a${i % aggregates}`;
        await writeOutbox(tx, {
          topic,
          type: "step",
          payload: { agg, seq: Math.floor(i / aggregates) },
          aggregateType: "account",
          aggregateId: agg,
        });
      }
    });
  }
}

/** A batch effect logging each message's aggregate and sequence number, in the order given. */
export function orderedEffect(consumer: string) {
  return async (tx: Tx, messages: { id: string; body: string }[]): Promise<void> => {
    await tx.query(
      `INSERT INTO ordered_effects (consumer, message_id, agg, seq)
       SELECT $1::text, e->>'id', e->>'agg', (e->>'seq')::int
       FROM jsonb_array_elements($2::text::jsonb) WITH ORDINALITY AS t(e, i) ORDER BY i`,
      [
        consumer,
        JSON.stringify(
          messages.map((m) => {
            const b = JSON.parse(m.body) as { agg: string; seq: number };
            return { id: m.id, agg: b.agg, seq: b.seq };
          }),
        ),
      ],
    );
  };
}

/**
 * What the consumer applied: effects in total, distinct messages, and how many effects came before an
 * earlier event of their aggregate (0 when the order was kept).
 */
export async function orderedResult(
  db: Db,
  consumer: string,
): Promise<{ total: number; distinct: number; outOfOrder: number }> {
  const { rows } = await db.query<{ total: string; distinct: string; out_of_order: string }>(
    `SELECT count(*) AS total, count(DISTINCT message_id) AS distinct,
            count(*) FILTER (WHERE seq <= prev) AS out_of_order
     FROM (SELECT message_id, seq, lag(seq) OVER (PARTITION BY agg ORDER BY n) AS prev
           FROM ordered_effects WHERE consumer = $1) t`,
    [consumer],
  );
  const r = rows[0]!;
  return { total: Number(r.total), distinct: Number(r.distinct), outOfOrder: Number(r.out_of_order) };
}
