import type { Db, QueryResult, Tx } from "../db.ts";
import { AfterCommitNotifier, CommitChannels, NOTIFY_SQL } from "./after-commit-notify.ts";

/**
 * The slice of postgres.js this adapter uses, typed structurally so `idem/postgres` never imports
 * `postgres` at run time: the `sql` function returned by `postgres(url)` satisfies it.
 */
export interface PostgresJsQueryable {
  unsafe(query: string, params?: any[], options?: { prepare?: boolean }): Promise<any>;
}
/** A connection postgres.js set aside for one caller (`sql.reserve()`), until `release()`. */
export interface PostgresJsReserved extends PostgresJsQueryable {
  /** Give the connection back to the pool. */
  release(): void;
}
/** What `fromPostgresJs` needs of postgres.js's `sql` (typed structurally: not imported at run time). */
export interface PostgresJsLike extends PostgresJsQueryable {
  /** A connection of its own until `release()` (postgres.js 3.4+ and 4): idem's transactions run on one. */
  reserve(): Promise<PostgresJsReserved>;
  /** Close the connections, waiting at most `timeout` seconds for running queries. */
  end(options?: { timeout?: number }): Promise<void>;
}

/**
 * A transaction ended in a rollback where COMMIT was asked: a statement of it had failed (its error
 * caught), so PostgreSQL answered the COMMIT with `ROLLBACK`, or its connection was lost and opened
 * again meanwhile. Nothing of the transaction was written; the caller must not report it done.
 */
export class CommitRolledBackError extends Error {
  /** Always `"CommitRolledBackError"`: the name logs and stack traces show. */
  override name = "CommitRolledBackError";
  constructor(why: string, options?: { cause?: unknown }) {
    super(`the transaction was rolled back, not committed (${why}): nothing of it was written`, options);
  }
}

/** An error PostgreSQL sent (it has a SQLSTATE), not one of the connection. */
function isServerError(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === "string" && /^[0-9A-Z]{5}$/.test(code);
}

/** postgres.js's errors for a connection that closed, ended or was destroyed under a query. */
function isConnectionError(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === "string" && code.startsWith("CONNECT");
}

function toParams(params: readonly unknown[] | undefined): any[] {
  if (!params) return [];
  // postgres.js sends Buffers as bytea; plain Uint8Arrays are serialised as arrays.
  return params.map((p) =>
    p instanceof Uint8Array && !Buffer.isBuffer(p) ? Buffer.from(p.buffer, p.byteOffset, p.byteLength) : p,
  );
}

async function run<R>(
  sql: PostgresJsQueryable,
  text: string,
  params: readonly unknown[] | undefined,
  prepare: boolean,
): Promise<QueryResult<R>> {
  const r = await sql.unsafe(text, toParams(params), { prepare });
  return { rows: Array.from(r as R[]), rowCount: (r as { count?: number }).count ?? 0 };
}

/**
 * Whether `sql` reaches PostgreSQL directly: the process id the server announced at start-up
 * (BackendKeyData, which postgres.js keeps as the query's `state`) is the backend that answers. A pooler
 * such as PgBouncer announces a key of its own; a TCP proxy (HAProxy) passes the server's through.
 */
export async function isDirectPostgresJs(sql: PostgresJsQueryable): Promise<boolean> {
  const q = sql.unsafe("SELECT pg_backend_pid() AS pid", [], { prepare: false }) as Promise<
    { pid: number }[]
  > & {
    state?: { pid?: unknown } | null;
  };
  const rows = await q;
  return typeof q.state?.pid === "number" && Number(rows[0]?.pid) === q.state.pid;
}

/** Options of {@link fromPostgresJs}. */
export interface FromPostgresJsOptions {
  /** End the `sql` instance on `close()`. Default: true. */
  owned?: boolean;
  /**
   * Named prepared statements: `true` always, `false` never, `"auto"` only when the connection turns out
   * to be direct, not through a pooler such as PgBouncer (see `isDirectPostgresJs`). Unnamed statements
   * cost postgres.js an extra round trip each (it describes a statement before it binds it). The
   * instance's own `prepare: false` wins over this. Default: `"auto"`.
   */
  prepare?: boolean | "auto";
}

/**
 * Adapt a postgres.js `sql` instance. `close()` ends it only when `owned` is true (the default). Works
 * through PgBouncer in transaction mode (see `FromPostgresJsOptions.prepare`; transactions run on a
 * reserved connection, their BEGIN and COMMIT never prepared, whatever the instance's `prepare`), and with multi-host URLs
 * (`postgres://h1,h2/db?target_session_attrs=read-write`), which postgres.js supports.
 */
export function fromPostgresJs(sql: PostgresJsLike, options: FromPostgresJsOptions = {}): Db {
  const owned = options.owned ?? true;
  const prepare = options.prepare ?? "auto";
  let named = prepare === "auto" ? undefined : prepare;
  let deciding: Promise<boolean> | undefined;
  const decided = async (): Promise<boolean> => {
    if (named !== undefined) return named;
    deciding ??= isDirectPostgresJs(sql).catch((err) => {
      deciding = undefined; // unreachable now: the next statement decides
      throw err;
    });
    named = await deciding;
    return named;
  };
  const notifier = new AfterCommitNotifier(async (channel) =>
    run(sql, NOTIFY_SQL, [channel], named ?? (await decided())),
  );
  return {
    driver: "postgres",
    query: async (text, params) => run(sql, text, params, named ?? (await decided())),
    async exec(text: string) {
      await sql.unsafe(text);
    },
    supportsBeginParams: true,
    async transaction<T>(
      fn: (tx: Tx) => Promise<T>,
      opts?: { begin?: string | { sql: string; params?: readonly unknown[] } },
    ): Promise<T> {
      const prepare = named ?? (await decided());
      const begin = opts?.begin;
      // Not `sql.begin`: it ends a transaction with `sql\`commit\``, a statement postgres.js prepares
      // under a name (the instance's `prepare`, true by default) once per connection and then only
      // binds. Through a transaction pooler the next transaction may run on another server session,
      // where that name does not exist: the Bind fails (26000), which aborts the transaction, and
      // postgres.js retries the COMMIT, which PostgreSQL then answers with ROLLBACK and no error. The
      // work was answered as done and was never written. Here BEGIN, COMMIT and ROLLBACK have no
      // parameters, so postgres.js sends them as simple queries: nothing prepared, on any connection.
      const tsql = await sql.reserve();
      const after = new CommitChannels();
      // The session the transaction began on (postgres.js keeps its BackendKeyData as a query's
      // `state`): a connection that closed and was opened again under it is another session.
      let session: unknown;
      const sameSession = (q: { state?: unknown }) => session === undefined || q.state === session;
      let broken = false;
      let failed: { error: unknown } | undefined; // the first statement of the work that failed
      const watch = <P extends Promise<unknown>>(q: P): P => {
        q.catch((error) => {
          failed ??= { error };
        });
        return q;
      };
      try {
        const opened = tsql.unsafe("BEGIN") as Promise<unknown> & { state?: unknown };
        await opened;
        session = opened.state ?? undefined;
        let value: T;
        try {
          if (typeof begin === "string") {
            if (begin) await tsql.unsafe(begin);
          } else if (begin) await run(tsql, begin.sql, begin.params, prepare);
          let last: Promise<unknown> | undefined;
          value = await fn({
            notifyAfterCommit: (channel) => after.add(channel),
            final(text, params) {
              last = watch(run(tsql, text, params, prepare));
            },
            raw: tsql,
            query: (text, params) => watch(run(tsql, text, params, prepare)),
            async exec(text: string) {
              await watch(tsql.unsafe(text));
            },
          });
          await last;
        } catch (err) {
          const rollback = tsql.unsafe("ROLLBACK") as Promise<unknown> & { state?: unknown };
          await rollback.then(
            () => {
              broken = !sameSession(rollback);
            },
            (e) => {
              broken = !isServerError(e); // the server answered: the session lives, the transaction ended
            },
          );
          throw err;
        }
        const commit = tsql.unsafe("COMMIT") as Promise<{ command?: string }> & { state?: unknown };
        const done = await commit;
        if (!sameSession(commit)) {
          broken = true;
          throw new CommitRolledBackError("the connection was lost during the transaction");
        }
        // A statement's error the work caught left the transaction aborted: COMMIT rolled it back.
        if (done.command !== "COMMIT") {
          throw new CommitRolledBackError("a statement in it had failed", failed && { cause: failed.error });
        }
        if (after.channels) notifier.notify(after.channels);
        return value;
      } catch (err) {
        if (isConnectionError(err)) broken = true;
        throw err;
      } finally {
        // A connection that closed is not handed back: postgres.js opens it again when it is needed.
        if (!broken) tsql.release();
      }
    },
    async close() {
      if (owned) await sql.end({ timeout: 5 });
    },
  };
}
