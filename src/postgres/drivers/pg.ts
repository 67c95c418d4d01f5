import type { Db, QueryResult, Tx } from "../db.ts";
import { AfterCommitNotifier, CommitChannels, NOTIFY_SQL } from "./after-commit-notify.ts";
import { type PgQueryable, run } from "./pg-query.ts";

export type { PgQueryable } from "./pg-query.ts";

/** What `fromPg` needs of a `pg.Pool` (typed structurally, so `pg` is not imported at run time). */
export interface PgPoolLike extends PgQueryable {
  /** Check a client out of the pool (for a transaction). */
  connect(): Promise<PgClientLike>;
  /** Close the pool. */
  end(): Promise<void>;
}
export interface PgClientLike extends PgQueryable {
  release(err?: boolean | Error): void;
  on(event: "error", fn: (err: Error) => void): unknown;
  removeListener(event: "error", fn: (err: Error) => void): unknown;
}

/**
 * Whether `client` talks to one PostgreSQL session of its own: the process id the server announced at
 * start-up (BackendKeyData) is the backend that runs its statements. A pooler (PgBouncer, in any mode)
 * announces a key of its own, so the two differ; a TCP proxy (HAProxy) passes the server's through.
 */
export async function isDirectPgSession(client: { query(text: string): Promise<unknown> }): Promise<boolean> {
  const announced = (client as { processID?: unknown }).processID;
  if (typeof announced !== "number") return false;
  const r = (await client.query("SELECT pg_backend_pid() AS pid")) as { rows: { pid: number }[] };
  return Number(r.rows[0]?.pid) === announced;
}

/** Options of {@link fromPg}. */
export interface FromPgOptions {
  /** End the pool on `close()`. Default: true. */
  owned?: boolean;
  /**
   * Named prepared statements: `true` always, `false` never, `"auto"` only when the first connection
   * turns out to be direct (not through a pooler such as PgBouncer; see `isDirectPgSession`).
   * Default: `"auto"`.
   */
  prepare?: boolean | "auto";
}

/**
 * Adapt a node-postgres `Pool`. `close()` ends the pool only when `owned` is true (the default).
 * A pool created with `pipeline: true` sends BEGIN and the transaction's first statement together.
 * Works through PgBouncer in transaction mode (see `FromPgOptions.prepare`).
 */
export function fromPg(pool: PgPoolLike, options: FromPgOptions = {}): Db {
  const owned = options.owned ?? true;
  const prepare = options.prepare ?? "auto";
  let named = prepare === "auto" ? undefined : prepare;
  let deciding: Promise<void> | undefined;
  /** Decide `named` on the first connection checked out (once; concurrent first users wait for it). */
  const decide = (client: PgQueryable): Promise<void> => {
    deciding ??= isDirectPgSession(client).then(
      (direct) => {
        named = direct;
      },
      (err) => {
        deciding = undefined; // the connection failed: the next checkout decides
        throw err;
      },
    );
    return deciding;
  };
  /** The first checkouts, until `named` is decided. */
  const checkoutDeciding = async (): Promise<PgClientLike> => {
    const client = await pool.connect();
    if (named === undefined) {
      try {
        await decide(client);
      } catch (err) {
        client.release(isConnectionError(err, client));
        throw err;
      }
    }
    return client;
  };
  // Once decided, the pool's own promise: no async layer per transaction.
  const checkout = (): Promise<PgClientLike> => (named === undefined ? checkoutDeciding() : pool.connect());
  const notifier = new AfterCommitNotifier((channel) =>
    onOwnClient(checkout, (client) => run(client, NOTIFY_SQL, [channel], named === true)),
  );
  return {
    driver: "pg",
    supportsBefore: true,
    supportsBeginParams: true,
    query: (sql, params) => onOwnClient(checkout, (client) => run(client, sql, params, named === true)),
    async exec(sql: string) {
      await onOwnClient(checkout, (client) => client.query(sql));
    },
    async transaction<T>(
      fn: (tx: Tx) => Promise<T>,
      opts?: {
        begin?: string | { sql: string; params?: readonly unknown[] };
        batch?: boolean;
        before?: { sql: string; params?: readonly unknown[] };
      },
    ): Promise<T> {
      const client = await checkout();
      const asNamed = named === true;
      let broken = false;
      // A checked-out client has no pool listener: if its connection dies (the server restarted), the
      // 'error' event would crash the process. The statements in flight reject on their own; mark the
      // client broken so the pool drops it.
      const onError = () => {
        broken = true;
      };
      client.on("error", onError);
      const wire = corkable(client);
      const pipelined = wire.pipelined;
      // A client without `pipeline` sends a statement only once the previous one has answered, so
      // sending them one after the other here costs no round trip. Queued on the client instead (a
      // statement added while another waits in its queue), node-postgres 8.19 and later print a
      // DeprecationWarning in the user's process ("Calling client.query() when the client is already
      // executing a query is deprecated and will be removed in pg@9.0").
      let tail: Promise<unknown> | undefined;
      const serial = <R>(send: () => Promise<R>): Promise<R> => {
        const p = tail === undefined ? send() : tail.then(send, send);
        tail = p;
        return p;
      };
      /** A statement of the transaction (prepared like any other), in order, with its parameters as now. */
      const statement = <R>(sql: string, params: readonly unknown[] | undefined): Promise<QueryResult<R>> => {
        if (pipelined) return run<R>(client, sql, params, asNamed);
        const values = params?.slice(); // the caller may change its array before this is sent
        return serial(() => run<R>(client, sql, values, asNamed));
      };
      /** A simple-protocol statement (BEGIN, COMMIT, a script), in order. */
      const simple = (text: string): Promise<unknown> =>
        pipelined ? client.query(text) : serial(() => client.query(text));
      // BEGIN is not awaited on its own: the next statement follows it (sent once it answered, or, in
      // pipeline mode, pipelined behind it), and its failure surfaces at the first statement or at
      // COMMIT. In pipeline mode the socket is corked meanwhile, so BEGIN and that statement leave in one
      // write.
      wire.cork();
      // `before` commits on its own (autocommit) ahead of BEGIN on this connection; it fails the
      // transaction where BEGIN would, at the first statement or at COMMIT.
      const before = opts?.before && statement(opts.before.sql, opts.before.params);
      const extra = opts?.begin;
      let begun: Promise<unknown> | undefined = simple(
        typeof extra === "string" && extra ? `BEGIN; ${extra}` : "BEGIN",
      );
      // A parameterised `begin` follows BEGIN on the wire (prepared like any statement, so it is not
      // parsed and planned each time as a script would be).
      if (extra && typeof extra !== "string") {
        const first = statement(extra.sql, extra.params);
        begun = Promise.all([begun, first]);
      }
      if (before) begun = Promise.all([before, begun]);
      begun.catch(() => {});
      // With `batch`, the first statement does not uncork: the second one (the handler's first, sent
      // before the first one answered) joins BEGIN and it in one write. If no second statement comes
      // in this turn of the event loop, the write leaves anyway.
      let held: NodeJS.Immediate | undefined;
      const release = () => {
        if (held) clearImmediate(held);
        held = undefined;
        wire.uncork();
      };
      /** Send what waits behind BEGIN; its answer, the first time (undefined after). */
      const settleBegin = (): Promise<unknown> | undefined => {
        const b = begun;
        if (!b) return undefined;
        begun = undefined;
        if (opts?.batch && wire.pipelined) held = setImmediate(release);
        else wire.uncork();
        return b;
      };
      let last: Promise<unknown> | undefined;
      let readOnlyDone = false;
      const after = new CommitChannels();
      const tx: Tx = {
        raw: client,
        pipelined: wire.pipelined,
        notifyAfterCommit: (channel) => after.add(channel),
        readOnlyDone() {
          readOnlyDone = wire.pipelined;
        },
        final(sql, params) {
          // Corked until COMMIT is queued behind it: the two leave in one write.
          wire.cork();
          last = statement(sql, params);
          last.catch(() => {});
        },
        // Not an async function: the statement's own promise is returned as it is (an async layer
        // that returns a promise costs three more promise jobs per statement), except for the
        // first one, which answers only once BEGIN did.
        query<R>(sql: string, params?: readonly unknown[]): Promise<QueryResult<R>> {
          if (last) wire.uncork(); // a statement after final() (against its contract) must not wait for COMMIT
          let q: Promise<QueryResult<R>>;
          try {
            q = statement<R>(sql, params);
          } catch (err) {
            return Promise.reject(err);
          }
          if (held) release(); // the batch's second statement: BEGIN, the first and this leave together
          const b = settleBegin();
          if (b) {
            q.catch(() => {});
            return b.then(() => q);
          }
          return q;
        },
        async exec(sql: string) {
          if (last) wire.uncork();
          const q = simple(sql);
          if (held) release();
          if (begun) {
            q.catch(() => {});
            await settleBegin();
          }
          await q;
        },
      };
      try {
        let value: T;
        try {
          value = await fn(tx);
          const b = settleBegin(); // a function that sent nothing: BEGIN still answers here
          if (b) await b;
        } catch (err) {
          release();
          if (readOnlyDone) {
            // What it read is the answer (a speculative work's statements are only being discarded):
            // pipelined, the ROLLBACK need not be waited for, as the read-only COMMIT below.
            simple("ROLLBACK").catch(() => {});
            throw err;
          }
          await simple("ROLLBACK").catch(() => {
            broken = true;
          });
          throw err;
        }
        // With `last` queued, COMMIT follows it on the wire; if `last` failed, PostgreSQL answers the
        // COMMIT of the aborted transaction with a rollback, and we report `last`'s error.
        const commit = simple("COMMIT");
        release();
        if (readOnlyDone && !last) {
          // Nothing written, everything read: the COMMIT only ends the transaction (and frees its
          // locks). Pipelined, whatever the next user of this connection sends follows it; a failure
          // (the connection died) reaches that user and the pool.
          commit.catch(() => {});
          return value;
        }
        if (last) {
          commit.catch(() => {});
          try {
            await last;
          } catch (err) {
            await commit.catch(() => {});
            throw err;
          }
        }
        await commit;
        if (after.channels) notifier.notify(after.channels);
        return value;
      } catch (err) {
        if (isConnectionError(err, client)) broken = true;
        throw err;
      } finally {
        release();
        // A healthy client goes back to the pool (which listens again); a broken one keeps our listener
        // for the late errors of its dying connection.
        if (!broken) client.removeListener("error", onError);
        client.release(broken);
      }
    },
    async close() {
      if (owned) await pool.end();
    },
  };
}

/**
 * Run one statement on a client checked out for it, with an 'error' listener until it is back in the
 * pool. Not `pool.query`: pg-pool listens for the client's 'error' only until the statement's callback,
 * and node-postgres emits the 'error' of a connection the server cut (57P01 on a restart) just after
 * failing the statement, so with no listener left the process crashed (seen in the chaos suite).
 */
async function onOwnClient<T>(
  checkout: () => Promise<PgClientLike>,
  fn: (client: PgClientLike) => Promise<T>,
): Promise<T> {
  const client = await checkout();
  let broken = false;
  const onError = () => {
    broken = true;
  };
  client.on("error", onError);
  try {
    return await fn(client);
  } catch (err) {
    if (isConnectionError(err, client)) broken = true;
    throw err;
  } finally {
    // A broken client keeps our listener for the late errors of its dying connection.
    if (!broken) client.removeListener("error", onError);
    client.release(broken);
  }
}

/**
 * Cork and uncork a pipelining client's socket, to send statements queued together in one write
 * (a write to a socket is a system call, and on a busy service those are a large share of the CPU).
 * `cork()` is idempotent and `uncork()` undoes it; a client that does not pipeline (whose next
 * statement waits for the previous answer anyway), or whose internals differ from node-postgres 8's
 * (`pipeline`, `connection.stream`), is left alone.
 */
function corkable(client: PgClientLike): { pipelined: boolean; cork(): void; uncork(): void } {
  const c = client as unknown as {
    pipeline?: boolean;
    connection?: { stream?: Partial<NodeJS.WritableStream> & { cork?(): void; uncork?(): void } };
  };
  const stream = c.pipeline === true ? c.connection?.stream : undefined;
  if (!stream || typeof stream.cork !== "function" || typeof stream.uncork !== "function") {
    return { pipelined: false, cork() {}, uncork() {} };
  }
  let corked = false;
  return {
    pipelined: true,
    cork() {
      if (corked) return;
      corked = true;
      stream.cork!();
    },
    uncork() {
      if (!corked) return;
      corked = false;
      stream.uncork!();
    },
  };
}

/**
 * Whether `err` means the connection itself is gone, so the pool must not hand it out again. Anything
 * else (a handler's 4xx thrown as a plain object, a validation error, a unique violation) leaves the
 * connection as good as before, and discarding it would cost a new server session per error.
 * Gone: the server's connection-exception class (08) and shutdowns (57P01-57P03), a socket error (a
 * Node code such as ECONNRESET or EPIPE), node-postgres' own "Connection terminated ..." and
 * "... not queryable" errors (no code), and any error once the client says it is not queryable.
 * Poisoned: 25006, a write on a read-only server. After a failover a connection made through a proxy
 * that had not switched yet reaches the old primary (or a replica), and every write on it would fail:
 * the pool's next connection reaches the new primary.
 */
export function isConnectionError(err: unknown, client?: unknown): boolean {
  const c = client as { _queryable?: boolean; _ending?: boolean } | undefined;
  if (c && (c._queryable === false || c._ending === true)) return true;
  if (typeof err !== "object" || err === null) return false;
  const code = (err as { code?: unknown }).code;
  if (typeof code === "string") {
    if (/^(08|57P0[123]|25006)/.test(code)) return true;
    return /^E[A-Z]+$/.test(code); // a Node system error: ECONNRESET, EPIPE, ETIMEDOUT, ...
  }
  if (!(err instanceof Error)) return false;
  return /^Connection terminated|not queryable|^Query read timeout/.test(err.message);
}

/** One statement through the adapter's query path (`bench/pg-driver.ts` measures it). Not part of the API. */
export { run as runPgStatement };
