import type { Db, QueryResult, Tx } from "../db.ts";

/**
 * The slice of postgres.js this adapter uses, typed structurally so `idem/postgres` never imports
 * `postgres` at run time: the `sql` function returned by `postgres(url)` satisfies it.
 */
interface PostgresJsQueryable {
  unsafe(query: string, params?: any[], options?: { prepare?: boolean }): Promise<any>;
}
/** What `fromPostgresJs` needs of postgres.js's `sql` (typed structurally: not imported at run time). */
export interface PostgresJsLike extends PostgresJsQueryable {
  /** Run `fn` in one transaction. */
  begin(fn: (sql: any) => Promise<any>): Promise<any>;
  /** Close the connections, waiting at most `timeout` seconds for running queries. */
  end(options?: { timeout?: number }): Promise<void>;
}

function toParams(params: readonly unknown[] | undefined): any[] {
  if (!params) return [];
  // postgres.js sends Buffers as bytea; plain Uint8Arrays are serialised as arrays.
  return params.map((p) => (p instanceof Uint8Array && !Buffer.isBuffer(p) ? Buffer.from(p) : p));
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
 * through PgBouncer in transaction mode (see `FromPostgresJsOptions.prepare`), and with multi-host URLs
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
      const body = async (tsql: PostgresJsQueryable) => {
        if (typeof begin === "string") {
          if (begin) await tsql.unsafe(begin);
        } else if (begin) await run(tsql, begin.sql, begin.params, prepare);
        let last: Promise<unknown> | undefined;
        const value = await fn({
          final(text, params) {
            last = run(tsql, text, params, prepare);
            last.catch(() => {});
          },
          raw: tsql,
          query: (text, params) => run(tsql, text, params, prepare),
          async exec(text: string) {
            await tsql.unsafe(text);
          },
        });
        await last;
        return value;
      };
      return (await sql.begin(body)) as T;
    },
    async close() {
      if (owned) await sql.end({ timeout: 5 });
    },
  };
}
