/**
 * A Lambda invocation's time. Lambda stops a function at its timeout (the runtime is restarted, or the
 * environment frozen until the next event): whatever it held must not stay held, and its caller must
 * get an answer before then.
 *
 *   - the answer: the invocation answers (409 in flight, a record left for redelivery) `reserveMs`
 *     before its remaining time runs out, and nothing it did after that is committed (the store sees a
 *     hang-up before its commit);
 *   - the hold: every transaction the invocation opens tells the database to end it past the remaining
 *     time (`statement_timeout`, `idle_in_transaction_session_timeout` and, for the inbox's mark,
 *     `lock_timeout`, all transaction-local, so they suit a transaction pooler such as RDS Proxy). A
 *     function that timed out mid-transaction is then rolled back by the database on its own clock, and
 *     the key (or the message) is free for the retry, which runs it once: the rolled-back run left
 *     nothing.
 *
 * The local clock only decides when this invocation answers its own caller; whether a key is taken is
 * decided by the database (its locks and its timeouts), as everywhere in idem.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import type { Db, HangUp, Tx } from "../core/index.ts";

/** What idem reads of Lambda's context object (`Context` of `@types/aws-lambda`). */
export interface LambdaContextLike {
  /** Milliseconds left before Lambda stops the invocation. */
  getRemainingTimeInMillis(): number;
}

/** The time kept back to send the answer, in ms, unless a route says otherwise. */
export const DEFAULT_RESERVE_MS = 500;

/** The database timeouts, set for the transaction only (`set_config(..., true)`). */
const BOUND_SQL =
  "SELECT set_config('statement_timeout', $1::text, true), set_config('idle_in_transaction_session_timeout', $1::text, true)";
const BOUND_LOCK_SQL = `${BOUND_SQL}, set_config('lock_timeout', $2::text, true)`;

/** One invocation's deadline. As a `HangUp` it reads aborted once the answer is due (or was given). */
export class Deadline implements HangUp {
  /** The answer was given (a 409 at the deadline): the work must not commit after it. */
  answered = false;
  private readonly endsAt: number;
  private readonly answerAt: number;

  /** `context` absent (a local call, a test without one): no deadline. */
  constructor(context: LambdaContextLike | undefined, reserveMs: number = DEFAULT_RESERVE_MS) {
    const remaining = context?.getRemainingTimeInMillis?.();
    const now = Date.now();
    this.endsAt = remaining === undefined ? Number.POSITIVE_INFINITY : now + remaining;
    this.answerAt = this.endsAt - reserveMs;
  }

  /** Milliseconds until the answer is due (at most 2^31 - 1: a timer's range). */
  answerInMs(): number {
    return Math.max(0, Math.min(this.answerAt - Date.now(), 2 ** 31 - 1));
  }

  get aborted(): boolean {
    return this.answered || Date.now() >= this.answerAt;
  }

  /** Make the database end `tx` once the invocation's remaining time is gone (no-op without a deadline). */
  bound(tx: Tx, lockWait = false): Promise<unknown> | undefined {
    if (this.endsAt === Number.POSITIVE_INFINITY) return undefined;
    const left = `${Math.max(1, Math.ceil(this.endsAt - Date.now()))}ms`;
    if (!lockWait) return tx.query(BOUND_SQL, [left]);
    return tx.query(BOUND_LOCK_SQL, [left, `${Math.max(1, Math.ceil(this.answerAt - Date.now()))}ms`]);
  }
}

/**
 * A `Db` whose transactions are bounded by the deadline of the invocation that opens them (read from
 * async context, so one `Db` serves every invocation of a container, even overlapping ones in tests).
 * Used under the inbox, whose transactions the SQS batch handler does not open itself.
 */
export class DeadlineDb implements Db {
  private readonly current = new AsyncLocalStorage<Deadline>();
  constructor(private readonly db: Db) {}

  get driver(): Db["driver"] {
    return this.db.driver;
  }

  /** Run `fn` with `deadline` bounding the transactions it opens. */
  within<T>(deadline: Deadline, fn: () => Promise<T>): Promise<T> {
    return this.current.run(deadline, fn);
  }

  query: Db["query"] = (sql, params) => this.db.query(sql, params);
  exec(sql: string): Promise<void> {
    return this.db.exec(sql);
  }
  close(): Promise<void> {
    return this.db.close();
  }

  transaction<T>(fn: (tx: Tx) => Promise<T>, options?: Parameters<Db["transaction"]>[1]): Promise<T> {
    const deadline = this.current.getStore();
    if (!deadline) return this.db.transaction(fn, options);
    return this.db.transaction(async (tx) => {
      await deadline.bound(tx, true);
      return fn(tx);
    }, options);
  }
}
