/**
 * The inbox: an idempotent consumer's memory of the messages it has finished.
 *
 * Timeline of one delivery:
 *
 *   BEGIN
 *     INSERT (consumer, message_id) INTO inbox ON CONFLICT DO NOTHING
 *       -> no row inserted: a copy was already applied (or parked). ROLLBACK; answer "duplicate".
 *          (A copy being applied right now holds the row's index entry: this insert waits for it,
 *          then sees its outcome.)
 *     the handler's effect, in the same transaction
 *   COMMIT  -> answer "applied"; only now may the broker be told (ack)
 *
 *   the handler threw: ROLLBACK, count the attempt in its own transaction, answer "retry" (the broker
 *   redelivers) or, at `maxAttempts`, park the message with its error and answer "parked" (the broker
 *   is told it is done with it, and later copies are skipped as duplicates).
 *
 * A crash anywhere before COMMIT leaves no trace: the redelivered copy is handled as the first. A crash
 * after COMMIT but before the ack leaves the mark: the redelivered copy is a duplicate.
 *
 * The inbox table is partitioned by time (as the keys are), so that marks past their retention are
 * dropped a partition at a time ({@link sweepInbox}). A unique index holds within one partition only,
 * so the mark's INSERT is guarded twice:
 *
 *   - it first looks for the message in every partition (a copy marked days ago is found), and
 *   - a mark made in the first `boundaryOverlapMs` of a partition also goes into the previous
 *     partition. Two copies processed at the same moment on either side of the boundary then meet on
 *     that partition's unique index: the later insert waits for the other transaction and sees its
 *     outcome. (Two copies at once further apart than the overlap would need a transaction open longer
 *     than it: ten minutes by default.)
 */

import type { Db, Tx } from "../core/db.ts";
import { isMissingPartition } from "../core/index.ts";
import { schemaOf } from "../postgres/schema/migrate.ts";
import { Partitions } from "../postgres/schema/partitions.ts";
import { type Delivery, errorOf } from "./types.ts";

/** What happened to a delivery, and so what the consumer tells the broker. */
export const InboxResult = {
  /** The effect committed now: ack. */
  applied: "applied",
  /** Already applied (or parked) before: ack and skip. */
  duplicate: "duplicate",
  /** The handler failed; attempts are left: do not ack (nack / let it be redelivered). */
  retry: "retry",
  /** The handler failed for the last time: the message is parked with its error. Ack (or terminate). */
  parked: "parked",
} as const;
/** One of the values of {@link InboxResult}. */
export type InboxResult = (typeof InboxResult)[keyof typeof InboxResult];

/** The effect of one message, run inside the inbox's transaction. Throw to roll it back. */
export type InboxHandler<M extends Delivery = Delivery> = (tx: Tx, message: M) => Promise<void>;

/**
 * The effect of several messages at once (set-based SQL: one statement for the lot), run inside the
 * inbox's transaction with the messages not seen before. Throw to roll them all back; each is then
 * retried alone (called with a one-message array), so only a failing one is retried and parked.
 */
export type InboxBatchHandler<M extends Delivery = Delivery> = (tx: Tx, messages: M[]) => Promise<void>;

/** Options of {@link Inbox}. */
export interface InboxOptions {
  /** The consumer's name: the same message is applied once per consumer. */
  consumer: string;
  /** The schema idem's tables live in. Default `"idem"`. */
  schema?: string;
  /** Failed attempts after which a message is parked. Default 5. */
  maxAttempts?: number;
  /** Called for each failed attempt (with its number) and each parked message. Default: none. */
  onError?: (err: Error, message: Delivery, attempt: number) => void;
  /**
   * A mark made this soon after a partition boundary also goes into the previous partition (see above).
   * Default 600,000 ms (10 minutes), at most the partition width.
   */
  boundaryOverlapMs?: number;
  /** The clock that places marks in partitions (for tests). Default `Date.now`. */
  clock?: () => number;
}

/** Handles deliveries for one consumer: dedup, effect and mark in one transaction; retries; parking. */
export class Inbox {
  /** The consumer's name: message ids are deduplicated per consumer. */
  readonly consumer: string;
  /** Attempts after which a failing message is parked. */
  readonly maxAttempts: number;
  readonly #db: Db;
  readonly #schema: string;
  readonly #onError: InboxOptions["onError"];
  readonly #clock: () => number;
  readonly #overlapMs: number;
  #layout: Promise<Partitions> | undefined;
  readonly #sql: {
    mark: string;
    markMany: string;
    clearAttempts: string;
    clearMany: string;
    attempt: string;
    park: string;
    parkMark: string;
  };

  constructor(db: Db, options: InboxOptions) {
    if (!options.consumer) throw new TypeError("Inbox needs a consumer name");
    this.#db = db;
    this.consumer = options.consumer;
    this.#schema = schemaOf(options);
    this.maxAttempts = Math.max(1, options.maxAttempts ?? 5);
    this.#onError = options.onError;
    const s = this.#schema;
    // $3: the partition of now; $4: the previous one, or NULL when the mark is not near the boundary.
    // The row in the previous partition has status 'marker' (count marks with status <> 'marker').
    // A mark counts only when every row of it went in. Rows go in (id, bucket) order, so two batches
    // sharing ids take their index entries in the same order (no deadlock).
    // Scalar subqueries, not NOT EXISTS: PostgreSQL would turn that into an anti-join and hash every
    // mark of the consumer; these probe each partition's primary key, message by message.
    const unseen = (id: string) =>
      `(SELECT 1 FROM ${s}.inbox i WHERE i.consumer = $1::text AND i.message_id = ${id} LIMIT 1) IS NULL
        AND (SELECT 1 FROM ${s}.inbox_parked p WHERE p.consumer = $1::text AND p.message_id = ${id}) IS NULL`;
    this.#sql = {
      mark: `INSERT INTO ${s}.inbox (bucket, consumer, message_id, status)
        SELECT b, $1::text, $2::text, CASE WHEN b = $3::int THEN 'done' ELSE 'marker' END
        FROM unnest(ARRAY[$4::int, $3::int]) AS b
        WHERE b IS NOT NULL AND ${unseen("$2::text")}
        ORDER BY b
        ON CONFLICT DO NOTHING RETURNING message_id`,
      markMany: `INSERT INTO ${s}.inbox (bucket, consumer, message_id, status)
        SELECT b, $1::text, t.id, CASE WHEN b = $3::int THEN 'done' ELSE 'marker' END
        FROM jsonb_array_elements_text($2::text::jsonb) AS t(id)
          CROSS JOIN unnest(ARRAY[$4::int, $3::int]) AS b
        WHERE b IS NOT NULL AND ${unseen("t.id")}
        ORDER BY t.id, b
        ON CONFLICT DO NOTHING RETURNING message_id`,
      clearAttempts: `DELETE FROM ${s}.inbox_attempts WHERE consumer = $1::text AND message_id = $2::text`,
      clearMany: `DELETE FROM ${s}.inbox_attempts
        WHERE consumer = $1::text AND message_id IN (SELECT jsonb_array_elements_text($2::text::jsonb))`,
      attempt: `
        INSERT INTO ${s}.inbox_attempts (consumer, message_id, attempts, last_error)
        VALUES ($1::text, $2::text, 1, $3::text)
        ON CONFLICT (consumer, message_id) DO UPDATE
          SET attempts = ${s}.inbox_attempts.attempts + 1, last_error = EXCLUDED.last_error, updated_at = now()
        RETURNING attempts`,
      park: `
        INSERT INTO ${s}.inbox_parked (consumer, message_id, topic, type, body, headers, attempts, last_error)
        VALUES ($1::text, $2::text, $3::text, $4::text, $5::text, $6::text::jsonb, $7::int, $8::text)
        ON CONFLICT (consumer, message_id) DO NOTHING`,
      parkMark: `
        INSERT INTO ${s}.inbox (bucket, consumer, message_id, status) VALUES ($3::int, $1::text, $2::text, 'parked')
        ON CONFLICT DO NOTHING`,
    };
    this.#clock = options.clock ?? Date.now;
    this.#overlapMs = options.boundaryOverlapMs ?? 600_000;
  }

  /** The inbox's partitions (width read from the settings once), those around now made sure of. */
  #partitions(): Promise<Partitions> {
    this.#layout ??= (async () => {
      const { rows } = await this.#db.query<{ partition_seconds: number }>(
        `SELECT partition_seconds FROM ${this.#schema}.settings`,
      );
      const p = new Partitions(this.#db, this.#schema, Number(rows[0]!.partition_seconds) * 1000, "inbox");
      const b = p.bucketOf(this.#clock());
      await p.ensure([b - 1, b, b + 1], [b - 1, b]);
      return p;
    })().catch((err) => {
      this.#layout = undefined;
      throw err;
    });
    return this.#layout;
  }

  /** Where a mark made now goes: `[bucket, previous bucket or null]`. */
  async #placement(): Promise<[number, number | null]> {
    const p = await this.#partitions();
    const now = this.#clock();
    const b = p.bucketOf(now);
    return [b, now - p.startOf(b) < Math.min(this.#overlapMs, p.widthMs) ? b - 1 : null];
  }

  /**
   * Run `work`; when it hit a bucket with no partition yet, create those around now and run it again.
   * A role that may not create them (`idem sweep` makes them ahead): `PartitionMissingError`.
   */
  async #withPartitions<T>(work: () => Promise<T>): Promise<T> {
    try {
      return await work();
    } catch (err) {
      if (!isMissingPartition(err)) throw err;
      const p = await this.#partitions();
      const b = p.bucketOf(this.#clock());
      await p.ensure([b - 1, b, b + 1], [b - 1, b]);
      return work();
    }
  }

  /**
   * Apply `handler` to `message` unless this consumer already did. Never throws for a handler failure
   * (that is `"retry"` or `"parked"`); throws only when the database cannot be reached at all, in which
   * case the message must not be acked either.
   */
  async process<M extends Delivery>(message: M, handler: InboxHandler<M>): Promise<InboxResult> {
    let duplicate = false;
    try {
      await this.#withPartitions(async () => {
        const [bucket, previous] = await this.#placement();
        duplicate = false;
        await this.#db.transaction(async (tx) => {
          const { rows } = await tx.query(this.#sql.mark, [this.consumer, message.id, bucket, previous]);
          if (rows.length < (previous === null ? 1 : 2)) {
            duplicate = true;
            return;
          }
          await handler(tx, message);
          // Only a redelivered message can have failed attempts on record (a failure is never acked).
          // The last statement: a pipelining driver sends it with the COMMIT.
          if (message.redelivered) tx.final(this.#sql.clearAttempts, [this.consumer, message.id]);
        });
      });
      return duplicate ? InboxResult.duplicate : InboxResult.applied;
    } catch (err) {
      return this.#failed(message, errorOf(err));
    }
  }

  /**
   * Apply a batch of messages in one transaction (one commit for all: the way to thousands of messages
   * a second). Results are in the order of `messages`. If any effect throws, the batch is rolled back
   * and each message is processed again on its own with {@link process}, so that only the failing one
   * is retried or parked. Copies of one id within the batch: the first is applied, the rest are
   * duplicates.
   *
   * `keyOf` names the messages whose order matters (a Kafka record key, an SQS message group): when
   * one of a key's messages fails on its own, its later ones in the batch are not run (answered
   * `"retry"`, no attempt counted), so that a key's effects never commit out of order.
   */
  async processBatch<M extends Delivery>(
    messages: readonly M[],
    handler: InboxHandler<M> | { batch: InboxBatchHandler<M> },
    keyOf?: (m: M) => string | undefined,
  ): Promise<InboxResult[]> {
    const one: InboxHandler<M> = typeof handler === "function" ? handler : (tx, m) => handler.batch(tx, [m]);
    if (messages.length === 0) return [];
    if (messages.length === 1) return [await this.process(messages[0]!, one)];
    const ids = [...new Set(messages.map((m) => m.id))].sort();
    let results: InboxResult[];
    try {
      const [bucket, previous] = await this.#placement();
      const rowsPerMark = previous === null ? 1 : 2;
      results = await this.#withPartitions(() =>
        this.#db.transaction(async (tx) => {
          const { rows } = await tx.query<{ message_id: string }>(this.#sql.markMany, [
            this.consumer,
            JSON.stringify(ids),
            bucket,
            previous,
          ]);
          const marked = new Map<string, number>();
          for (const r of rows) marked.set(r.message_id, (marked.get(r.message_id) ?? 0) + 1);
          const fresh = new Set([...marked].filter(([, n]) => n === rowsPerMark).map(([id]) => id));
          const out: InboxResult[] = [];
          const redelivered: string[] = [];
          const todo: M[] = [];
          for (const m of messages) {
            if (!fresh.delete(m.id)) {
              out.push(InboxResult.duplicate);
              continue;
            }
            if (typeof handler === "function") await handler(tx, m);
            else todo.push(m);
            if (m.redelivered) redelivered.push(m.id);
            out.push(InboxResult.applied);
          }
          if (todo.length > 0 && typeof handler !== "function") await handler.batch(tx, todo);
          if (redelivered.length > 0) {
            await tx.query(this.#sql.clearMany, [this.consumer, JSON.stringify(redelivered)]);
          }
          return out;
        }),
      );
    } catch {
      // Somebody's effect failed (or the batch deadlocked with another): find out who, one by one.
      results = [];
      const held = new Set<string>();
      for (const m of messages) {
        const key = keyOf?.(m);
        if (key !== undefined && held.has(key)) {
          results.push(InboxResult.retry);
          continue;
        }
        const r = await this.process(m, one);
        if (r === InboxResult.retry && key !== undefined) held.add(key);
        results.push(r);
      }
    }
    return results;
  }

  async #failed(message: Delivery, error: Error): Promise<InboxResult> {
    const text = (error.message || error.name).slice(0, 2_000);
    const { rows } = await this.#db.query<{ attempts: number }>(this.#sql.attempt, [
      this.consumer,
      message.id,
      text,
    ]);
    const attempt = Number(rows[0]?.attempts ?? 1);
    this.#onError?.(error, message, attempt);
    if (attempt < this.maxAttempts) return InboxResult.retry;
    const [bucket] = await this.#placement();
    await this.#withPartitions(() =>
      this.#db.transaction(async (tx) => {
        await tx.query(this.#sql.park, [
          this.consumer,
          message.id,
          message.topic,
          message.type,
          message.body,
          JSON.stringify(message.headers),
          attempt,
          text,
        ]);
        await tx.query(this.#sql.parkMark, [this.consumer, message.id, bucket]);
        await tx.query(this.#sql.clearAttempts, [this.consumer, message.id]);
      }),
    );
    return InboxResult.parked;
  }

  /**
   * Inside `process`'s handler: record that this message was taken in but its effect deliberately not
   * applied (an event older than the state the row holds), so the mark reads `"stale"`, not `"done"`.
   * Its later copies are duplicates all the same.
   */
  async markStale(tx: Tx, messageId: string): Promise<void> {
    await tx.query(
      `UPDATE ${this.#schema}.inbox SET status = 'stale'
        WHERE consumer = $1::text AND message_id = $2::text AND status = 'done'`,
      [this.consumer, messageId],
    );
  }

  /**
   * What this consumer did with a message: `"done"` (applied), `"stale"` (taken in, not applied),
   * `"parked"`, or null when it has no mark (never seen, or past retention).
   */
  async statusOf(messageId: string): Promise<"done" | "stale" | "parked" | null> {
    const { rows } = await this.#db.query<{ status: string }>(
      `SELECT status FROM ${this.#schema}.inbox
        WHERE consumer = $1::text AND message_id = $2::text AND status <> 'marker' LIMIT 1`,
      [this.consumer, messageId],
    );
    return (rows[0]?.status as "done" | "stale" | "parked" | undefined) ?? null;
  }

  /** This consumer's parked messages, oldest first. */
  async parked(): Promise<ParkedMessage[]> {
    const { rows } = await this.#db.query<Record<string, unknown>>(
      `SELECT message_id, topic, type, body, headers::text AS headers, attempts, last_error, parked_at
       FROM ${this.#schema}.inbox_parked WHERE consumer = $1::text ORDER BY parked_at, message_id`,
      [this.consumer],
    );
    return rows.map(parkedMessageOf);
  }

  /**
   * Forget a parked message so that its next delivery is processed again (republish it, e.g. with
   * `requeueParked` on the producer's side, or from `parked()`'s body). Resolves true if it was parked.
   */
  async unpark(messageId: string): Promise<boolean> {
    return this.#db.transaction(async (tx) => {
      const { rowCount } = await tx.query(
        `DELETE FROM ${this.#schema}.inbox_parked WHERE consumer = $1::text AND message_id = $2::text`,
        [this.consumer, messageId],
      );
      await tx.query(
        `DELETE FROM ${this.#schema}.inbox WHERE consumer = $1::text AND message_id = $2::text AND status = 'parked'`,
        [this.consumer, messageId],
      );
      return rowCount > 0;
    });
  }
}

/** A message parked by a consumer's inbox after its last allowed attempt. */
export interface ParkedMessage {
  /** The producer's message id. */
  messageId: string;
  /** The topic it came from, when known. */
  topic: string | null;
  /** Its type, when known. */
  type: string | null;
  /** The raw body. */
  body: string;
  /** Its headers. */
  headers: Record<string, string>;
  /** Attempts made. */
  attempts: number;
  /** The last attempt's error. */
  lastError: string | null;
  /** When it was parked. */
  parkedAt: Date;
}

/**
 * Retention of dedup marks: drop the inbox partitions whose marks are all older than `retentionMs`,
 * and create those ahead (`partitionsAhead`: two days with daily partitions), which needs the CREATE
 * privilege: the schema owner's job (`idem sweep`). Keep marks longer than a message can take to be redelivered (broker
 * retention, relay lease and backoff), or a late copy would be applied again. Parked messages stay
 * in `inbox_parked` (and are skipped) until unparked. Run it periodically, from one or many processes.
 */
export async function sweepInbox(
  db: Db,
  options: { retentionMs: number; schema?: string; clock?: () => number },
): Promise<{ dropped: number[] }> {
  const schema = schemaOf(options);
  const now = (options.clock ?? Date.now)();
  const { rows } = await db.query<{ partition_seconds: number }>(
    `SELECT partition_seconds FROM ${schema}.settings`,
  );
  const partitions = new Partitions(db, schema, Number(rows[0]!.partition_seconds) * 1000, "inbox");
  await partitions.makeAhead(now);
  return { dropped: await partitions.dropExpired(now, options.retentionMs) };
}

/** A parked message as read from `inbox_parked` (headers selected as text). */
export function parkedMessageOf(r: Record<string, unknown>): ParkedMessage {
  return {
    messageId: String(r.message_id),
    topic: r.topic === null ? null : String(r.topic),
    type: r.type === null ? null : String(r.type),
    body: String(r.body),
    headers: JSON.parse(String(r.headers)) as Record<string, string>,
    attempts: Number(r.attempts),
    lastError: r.last_error === null ? null : String(r.last_error),
    parkedAt: new Date(r.parked_at as string),
  };
}
