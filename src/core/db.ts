/**
 * The one small interface every PostgreSQL driver is adapted to.
 *
 * The store only ever needs three things: run one parameterised statement, run a script of several
 * statements without parameters (migrations, `BEGIN; SET LOCAL ...`), and run a function inside a
 * transaction on one connection. Users bring their own pool through a driver adapter
 * (`fromPg`, `fromPostgresJs`, `fromPglite`) or implement this interface themselves.
 */
export interface QueryResult<R = Record<string, unknown>> {
  /** The rows the statement returned, as objects by column name. */
  rows: R[];
  /** Rows inserted, updated or deleted by the statement (0 for a plain SELECT that returned nothing). */
  rowCount: number;
}

/** Something that runs one SQL statement: a `Db` or a `Tx`. */
export interface Queryable {
  /** Run one statement with `$1..$n` parameters. `Uint8Array` parameters are sent as `bytea`. */
  query<R = Record<string, unknown>>(sql: string, params?: readonly unknown[]): Promise<QueryResult<R>>;
}

/** A connection inside an open transaction. */
export interface Tx extends Queryable {
  /** Run several `;`-separated statements without parameters, in order. */
  exec(sql: string): Promise<void>;
  /**
   * Queue the transaction's last statement: drivers that pipeline send it together with COMMIT. Its
   * result is awaited by `transaction()`; if it fails, the transaction rolls back and `transaction()`
   * rejects with its error. Call it at most once, as the last thing the transaction does.
   */
  final(sql: string, params?: readonly unknown[]): void;
  /** The driver's own transaction object (a `pg` client, a postgres.js `sql`, a PGlite `Transaction`). */
  readonly raw: unknown;
  /**
   * Optional hint: what the transaction read is all the caller needs, and it wrote nothing it keeps, so
   * its end (COMMIT, or the ROLLBACK when the function then throws) need not be waited for. A pipelining
   * driver sends it and hands the connection back at once (its next user's statements follow it on the
   * wire); others ignore the hint. A replay uses it, also one that discards a speculative work's writes.
   */
  readOnlyDone?(): void;
  /**
   * Whether statements are pipelined: sent without waiting for the answers of those before them, so
   * that several leave in one write. Drivers that cannot say leave it undefined.
   */
  readonly pipelined?: boolean | undefined;
  /**
   * Optional: send `NOTIFY channel` once this transaction has committed, from outside it (nothing if it
   * rolls back). `fromPg`, `fromPostgresJs` and the ORM integrations have it, and coalesce the NOTIFYs
   * of many transactions.
   * `writeOutbox` uses it to wake relays without a NOTIFY inside the transaction, which would make its
   * commit wait for every other notifying transaction's. Returns true the first time it is called in
   * this transaction.
   */
  notifyAfterCommit?(channel: string): boolean;
}

/**
 * A database, whatever the driver (`fromPg`, `fromPostgresJs`, `fromPglite`, or an ORM's adapter): one
 * statement at a time, or several in one transaction.
 */
export interface Db extends Queryable {
  /** Run several `;`-separated statements without parameters, in order, on one connection. */
  exec(sql: string): Promise<void>;
  /**
   * Run `fn` in one transaction on one connection: commit when it resolves, roll back when it throws.
   * `begin` is extra SQL sent with BEGIN in the same round trip (e.g. `SET LOCAL lock_timeout = '5s'`);
   * for a `Db` whose `supportsBeginParams` is true, it may be one parameterised statement instead (run
   * right after BEGIN, prepared like any other; its rows are not returned, and its failure fails the
   * transaction's first statement).
   * `batch`: a pipelining driver holds BEGIN and the first statement until the second is queued (or the
   * current turn of the event loop ends), so the three leave in one write; others ignore it.
   * `before`: a statement committed on its own just before BEGIN, on the same connection, so that a
   * pipelining driver sends it with BEGIN in one write. Only for a `Db` whose `supportsBefore` is true
   * (others may ignore it): if it fails, the transaction rolls back and `transaction()` rejects with
   * its error; its rows are not returned.
   */
  transaction<T>(
    fn: (tx: Tx) => Promise<T>,
    options?: {
      begin?: string | { sql: string; params?: readonly unknown[] };
      batch?: boolean;
      before?: { sql: string; params?: readonly unknown[] };
    },
  ): Promise<T>;
  /** Whether `transaction()` honours its `before` option (callers run that statement first otherwise). */
  readonly supportsBefore?: boolean;
  /** Whether `transaction()` takes a parameterised statement as `begin` (callers send a string otherwise). */
  readonly supportsBeginParams?: boolean;
  /** Close the pool (only when the adapter owns it). */
  close(): Promise<void>;
  /** A short name of the driver, for logs and error messages. */
  readonly driver: "pg" | "postgres" | "pglite" | (string & {});
}
