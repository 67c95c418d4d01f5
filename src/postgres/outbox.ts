/**
 * The transactional outbox's writer: an event row written in the same transaction as the change it
 * announces, so both commit or neither does. A relay publishes the rows later, at least once, with the
 * row's id as the message id (so consumers can deduplicate).
 *
 *   await store.transaction(async (tx) => {
 *     await tx.query("INSERT INTO payments ...");
 *     await writeOutbox(tx, { topic: "receipt-email", type: "payment.succeeded", payload: { ... } });
 *   });
 */

import { outboxHeaders } from "../observability/messaging.ts";
import type { Queryable } from "./db.ts";
import { checkSchemaName } from "./migrate.ts";
import { uuidv7 } from "./uuid7.ts";

/** An event written to the outbox in the caller's transaction (`writeOutbox`), published by the relay. */
export interface OutboxEvent {
  /** Where the relay publishes it (a queue, a subject, a webhook topic). */
  topic: string;
  /** What happened, e.g. `"payment.succeeded"`. */
  type: string;
  /** The event's body (JSON). */
  payload: unknown;
  /** With `aggregateId`: events of one aggregate are published in the order they were written. */
  aggregateType?: string;
  /** The aggregate's id (e.g. the order's): with `orderByAggregate`, its events go out in order. */
  aggregateId?: string;
  /** Message headers to publish with it. Default: none. */
  headers?: Record<string, string>;
  /** The event id (a UUID). Default: a new UUIDv7, time-ordered. */
  id?: string;
}

const statements = new Map<string, string>();

function insertSql(schema: string): string {
  let sql = statements.get(schema);
  if (!sql) {
    sql = `INSERT INTO ${checkSchemaName(schema)}.outbox
             (id, topic, type, payload, aggregate_type, aggregate_id, headers)
           VALUES ($1::uuid, $2, $3, $4::text::jsonb, $5, $6, $7::text::jsonb)`;
    statements.set(schema, sql);
  }
  return sql;
}

/**
 * Write one event into the outbox, inside the caller's transaction. Returns the event id.
 * `schema` is where idem's tables live (default `"idem"`).
 */
export async function writeOutbox(
  tx: Queryable,
  event: OutboxEvent,
  options: { schema?: string } = {},
): Promise<string> {
  const id = event.id ?? uuidv7();
  await tx.query(insertSql(options.schema ?? "idem"), [
    id,
    event.topic,
    event.type,
    JSON.stringify(event.payload ?? null),
    event.aggregateType ?? null,
    event.aggregateId ?? null,
    JSON.stringify(outboxHeaders(event.headers) ?? {}), // with the request's trace context, if traced
  ]);
  return id;
}
