/** Operating the inbox by hand: every consumer's parked messages, and unparking one. */
import type { Db } from "../core/db.ts";
import { schemaOf } from "../postgres/schema/migrate.ts";
import { Inbox, type ParkedMessage, parkedMessageOf } from "./inbox.ts";

/** A parked message and the consumer it failed in. */
export interface ConsumerParkedMessage extends ParkedMessage {
  /** The consumer it failed in. */
  consumer: string;
}

/** The parked messages of every consumer (or of `consumer`), oldest first, at most `limit` (100). */
export async function parkedMessages(
  db: Db,
  options: { schema?: string; consumer?: string; limit?: number } = {},
): Promise<ConsumerParkedMessage[]> {
  const s = schemaOf(options);
  const { rows } = await db.query<Record<string, unknown>>(
    `SELECT consumer, message_id, topic, type, body, headers::text AS headers, attempts, last_error, parked_at
       FROM ${s}.inbox_parked WHERE ($1::text IS NULL OR consumer = $1::text)
      ORDER BY parked_at, consumer, message_id LIMIT $2`,
    [options.consumer ?? null, Math.max(1, Math.floor(options.limit ?? 100))],
  );
  return rows.map((r) => ({ consumer: String(r.consumer), ...parkedMessageOf(r) }));
}

/** `Inbox.unpark` for any consumer: its next delivery of the message is processed again. */
export function unparkMessage(
  db: Db,
  consumer: string,
  messageId: string,
  options: { schema?: string } = {},
): Promise<boolean> {
  return new Inbox(db, { consumer, schema: options.schema }).unpark(messageId);
}
