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

import { outboxHeaders } from "../core/observe.ts";
import type { Queryable, Tx } from "./db.ts";
import { checkSchemaName } from "./schema/migrate.ts";
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

/** Per schema: the INSERT of one event, in its two forms, and the relays' channel. */
interface Statements {
  plain: string;
  /**
   * Also says, in the same statement, that the transaction's driver wakes the relays after it commits
   * (`Tx.notifyAfterCommit`), so the outbox's trigger sends no NOTIFY from inside it
   * (sql/0015_outbox_wake.sql); the WHERE runs before the statement's trigger fires.
   */
  wakeAfterCommit: string;
  channel: string;
}

const statements = new Map<string, Statements>();

function statementsFor(schema: string): Statements {
  let sql = statements.get(schema);
  if (!sql) {
    const into = `INSERT INTO ${checkSchemaName(schema)}.outbox
             (id, topic, type, payload, aggregate_type, aggregate_id, headers)`;
    const values = "$1::uuid, $2, $3, $4::text::jsonb, $5, $6, $7::text::jsonb";
    sql = {
      plain: `${into} VALUES (${values})`,
      wakeAfterCommit: `${into} SELECT ${values}
           WHERE set_config('idem.outbox_wake', 'after-commit', true) IS NOT NULL`,
      channel: `${schema}_outbox`,
    };
    statements.set(schema, sql);
  }
  return sql;
}

/**
 * Write one event into the outbox, inside the caller's transaction. Returns the event id.
 * `schema` is where idem's tables live (default `"idem"`).
 *
 * Relays are woken once the transaction commits: by a NOTIFY sent after the commit, outside it, when
 * `tx` is a transaction of `fromPg`, `fromPostgresJs` or an ORM integration's `Db` (coalesced with
 * other transactions'), else by the outbox's trigger, inside it.
 */
export async function writeOutbox(
  tx: Queryable,
  event: OutboxEvent,
  options: { schema?: string } = {},
): Promise<string> {
  const id = event.id ?? uuidv7();
  const sql = statementsFor(options.schema ?? "idem");
  const afterCommit = (tx as Partial<Tx>).notifyAfterCommit?.(sql.channel);
  await tx.query(afterCommit ? sql.wakeAfterCommit : sql.plain, [
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
