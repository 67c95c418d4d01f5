/**
 * SQS batches on Lambda: `sqsBatch(handler, options)` applies each record once through the inbox (the
 * record's id and its effect in one PostgreSQL transaction) and answers `batchItemFailures` with the
 * records that must come back, so that only those are redelivered (the event source mapping needs
 * `FunctionResponseTypes: ["ReportBatchItemFailures"]`).
 *
 *   const db = fromPg(new pg.Pool({ max: 1 })); // once per container
 *   export const handler = sqsBatch(
 *     async (tx, record) => { await applyOrder(tx, JSON.parse(record.body)); },
 *     { db, consumer: "orders" },
 *   );
 *
 * Per record:
 *   applied, or a duplicate of one applied before  -> done (deleted from the queue)
 *   the handler threw, attempts left               -> in batchItemFailures (redelivered)
 *   the handler threw for the last time            -> parked in the inbox, done
 *   the database could not be reached              -> in batchItemFailures
 * A FIFO queue's records are in order within a message group: after a group's first failure, the
 * group's later records are reported failed without being run (SQS hands them back in order); other
 * groups go on. A record still unstarted when the invocation's remaining time is nearly gone is
 * reported failed too, and comes back.
 *
 * What each fault leaves:
 *   - a crash mid-batch (the function dies, no answer): Lambda retries the whole batch; the records that
 *     committed are duplicates then, the others run.
 *   - one record delivered twice at once (two invocations): both inserts meet on the inbox's unique
 *     index; the second waits for the first's transaction and skips the record once it committed.
 *   - a record whose work outlives the visibility timeout: its copy waits on the same index entry, at
 *     most until its own invocation's time runs out (lock_timeout), and comes back later as a duplicate.
 *     A function that times out mid-record is rolled back by the database (deadline.ts): its redelivery
 *     runs the record once.
 */
import type { Db, Tx } from "../core/index.ts";
import { Inbox, type InboxOptions, InboxResult } from "../messaging/inbox.ts";
import { deliveryOfSqsRecord, type SqsRecordLike } from "../messaging/sqs-delivery.ts";
import { DEFAULT_RESERVE_MS, Deadline, DeadlineDb, type LambdaContextLike } from "./deadline.ts";

/** The SQS event Lambda passes (`SQSEvent` of `@types/aws-lambda`), the fields idem reads. */
export interface SqsEventLike<R extends SqsRecordLike = SqsRecordLike> {
  Records: R[];
}

/** What the batch handler answers (`SQSBatchResponse`). */
export interface SqsBatchResult {
  batchItemFailures: Array<{ itemIdentifier: string }>;
}

/** The effect of one record, run in the inbox's transaction: throw to roll it back (it comes back). */
export type SqsRecordHandler<R extends SqsRecordLike = SqsRecordLike, Ctx = LambdaContextLike> = (
  tx: Tx,
  record: R,
  context: Ctx,
) => Promise<void>;

/** Options of {@link sqsBatch}. */
export interface SqsBatchOptions<R extends SqsRecordLike = SqsRecordLike>
  extends Omit<InboxOptions, "consumer"> {
  /** The pool, made once per container (outside the handler). Required. */
  db: Db;
  /** The consumer's name: a message is applied once per consumer. Required. */
  consumer: string;
  /**
   * The id a record is deduplicated on. Default: the `idem-message-id` message attribute when the
   * producer set one (idem's outbox event id, the same in every copy it sent), else SQS's `messageId`
   * (the same in every redelivery of one sent message).
   */
  messageId?: (record: R) => string;
  /** Time kept back, in ms, to answer before the function's timeout. Default: 500. */
  reserveMs?: number;
}

/** Make a Lambda handler for SQS batches that applies each record once (see the file's notes). */
export function sqsBatch<
  R extends SqsRecordLike = SqsRecordLike,
  Ctx extends LambdaContextLike = LambdaContextLike,
>(
  handler: SqsRecordHandler<R, Ctx>,
  options: SqsBatchOptions<R>,
): (event: SqsEventLike<R>, context: Ctx) => Promise<SqsBatchResult> {
  if (typeof handler !== "function") throw new TypeError("sqsBatch() needs the record handler function");
  const { db, messageId, reserveMs = DEFAULT_RESERVE_MS, ...inboxOptions } = options;
  const bounded = new DeadlineDb(db);
  const inbox = new Inbox(bounded, inboxOptions);
  return async function idempotentSqsBatch(event, context) {
    const deadline = new Deadline(context, reserveMs);
    const failures: Array<{ itemIdentifier: string }> = [];
    const stoppedGroups = new Set<string>();
    await bounded.within(deadline, async () => {
      for (const record of event.Records) {
        const group = record.attributes?.MessageGroupId;
        let ok = false;
        if (!deadline.aborted && !(group !== undefined && stoppedGroups.has(group))) {
          const delivery = { ...deliveryOfSqsRecord(record, messageId), record };
          try {
            const result = await inbox.process(delivery, (tx, d) => handler(tx, d.record, context));
            ok = result !== InboxResult.retry;
          } catch {
            ok = false; // the database could not be reached: the record comes back
          }
        }
        if (!ok) {
          failures.push({ itemIdentifier: record.messageId });
          if (group !== undefined) stoppedGroups.add(group);
        }
      }
    });
    return { batchItemFailures: failures };
  };
}
