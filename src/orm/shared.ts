/**
 * What the ORM integrations share: a `Db` (the interface idem's store runs on) built on an ORM's own
 * transactions, so that idem joins the ORM's transaction instead of opening one beside it. The store's
 * statements (claim, lookup, saved answer) run through the ORM's raw-SQL entry point on the ORM's
 * transaction object, which the handler then gets back, typed, to write with idiomatic ORM code: the
 * claim, the handler's writes and the saved answer commit together or not at all.
 *
 * Each integration (drizzle.ts, kysely.ts, knex.ts) only says how to run one statement on its ORM and
 * how to open a transaction; nothing here imports an ORM.
 */
import type { Db, QueryResult, Tx } from "../core/db.ts";
import { unguarded } from "../core/guarded-tx.ts";
import { AfterCommitNotifier, CommitChannels, NOTIFY_SQL } from "../postgres/drivers/after-commit-notify.ts";

/** How one ORM runs a statement with `$1..$n` parameters on a handle (its database or a transaction). */
export interface OrmDriver<H, T extends H> {
  /** The ORM's name, for `db.driver` and error messages. */
  readonly name: string;
  /** The ORM's database handle (outside any transaction). */
  readonly root: H;
  query(on: H, sql: string, params: unknown[]): Promise<QueryResult<any>>;
  /** Run `fn` in one of the ORM's transactions: commit when it resolves, roll back when it throws. */
  transaction<R>(fn: (trx: T) => Promise<R>): Promise<R>;
  /** Close the ORM's pool. */
  close(): Promise<void>;
  /** The driver's error (with its SQLSTATE as `code`) in what the ORM threw. Default: `err.cause` when it has a code. */
  driverError?(err: unknown): unknown;
}

/** A `Db` on an ORM, and the way back from idem's `Tx` to the ORM's transaction object. */
export interface OrmDb<T> extends Db {
  /**
   * The ORM's transaction of this request (`ctx.tx` of an atomic route): write through it, and the
   * writes commit with the key and the saved answer. Throws when `tx` did not come from this `Db`.
   */
  tx(tx: Tx): T;
}

/** Node drivers send Buffers as bytea; plain Uint8Arrays they would not. */
function toParams(params: readonly unknown[] | undefined): unknown[] {
  if (!params) return [];
  return params.map((p) => (p instanceof Uint8Array && !Buffer.isBuffer(p) ? Buffer.from(p) : p));
}

/**
 * An ORM may wrap the driver's error in its own (Drizzle's `DrizzleQueryError`); the store reads the
 * SQLSTATE (`code`) of what a statement throws, so hand it the driver's error.
 */
function driverError(err: unknown): unknown {
  const cause = (err as { cause?: { code?: unknown } } | null)?.cause;
  return cause && typeof cause === "object" && typeof cause.code === "string" ? cause : err;
}

export function ormDb<H, T extends H>(driver: OrmDriver<H, T>): OrmDb<T> {
  const ours = new WeakSet<object>();
  const run = <R>(on: H, sql: string, params?: readonly unknown[]) =>
    driver.query(on, sql, toParams(params)).then(
      (r) => r as QueryResult<R>,
      (err: unknown) => Promise.reject((driver.driverError ?? driverError)(err)),
    );
  // The outbox's wake-up, sent after the ORM's transaction commits rather than from inside it, as
  // idem's own drivers do (after-commit-notify.ts): concurrent writers of events do not queue at commit.
  const notifier = new AfterCommitNotifier((channel) => run(driver.root, NOTIFY_SQL, [channel]));
  return {
    driver: driver.name,
    query: (sql, params) => run(driver.root, sql, params),
    async exec(sql) {
      await run(driver.root, sql);
    },
    async transaction<R>(fn: (tx: Tx) => Promise<R>, options?: { begin?: string }): Promise<R> {
      const after = new CommitChannels();
      const value = await driver.transaction(async (trx) => {
        ours.add(trx as object);
        // Without parameters the drivers use the simple protocol, so `begin` may hold several statements.
        if (options?.begin) await run(trx, options.begin);
        let last: Promise<unknown> | undefined;
        const value = await fn({
          raw: trx,
          query: (sql, params) => run(trx, sql, params),
          async exec(sql) {
            await run(trx, sql);
          },
          final(sql, params) {
            last = run(trx, sql, params);
            last.catch(() => {}); // awaited below, before the ORM commits
          },
          notifyAfterCommit: (channel) => after.add(channel),
        });
        await last;
        return value;
      });
      // Committed: the ORM resolves its transaction only after COMMIT succeeded.
      if (after.channels) notifier.notify(after.channels);
      return value;
    },
    close: () => driver.close(),
    tx(tx: Tx): T {
      // The request's transaction is fenced (guarded-tx.ts): its `raw` is the ORM's transaction behind a
      // fence that throws once the handler returned; that fenced object is what the handler gets.
      const raw = tx.raw as T;
      const real = unguarded(raw);
      const isObject = (typeof real === "object" && real !== null) || typeof real === "function";
      if (!isObject || !ours.has(real as object)) {
        throw new TypeError(
          `This transaction was not opened by ${driver.name}: open the store on the same Db ` +
            `(PostgresStore.open(db)) whose tx() you call.`,
        );
      }
      return raw;
    },
  };
}

/** Rows of a result that is a row array (postgres.js) or carries `rows` (node-postgres). */
export function resultOf(r: unknown): QueryResult<any> {
  if (Array.isArray(r)) {
    return { rows: Array.from(r), rowCount: (r as { count?: number }).count ?? r.length };
  }
  const o = r as { rows?: unknown[]; rowCount?: number | null };
  return { rows: o.rows ?? [], rowCount: o.rowCount ?? 0 };
}
