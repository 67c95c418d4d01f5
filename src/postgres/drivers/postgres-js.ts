import type { Db, QueryResult, Tx } from "../db.ts";

/**
 * The slice of postgres.js this adapter uses, typed structurally so `idem/postgres` never imports
 * `postgres` at run time: the `sql` function returned by `postgres(url)` satisfies it.
 */
interface PostgresJsQueryable {
  unsafe(query: string, params?: any[], options?: { prepare?: boolean }): Promise<any>;
}
export interface PostgresJsLike extends PostgresJsQueryable {
  begin(fn: (sql: any) => Promise<any>): Promise<any>;
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
  params?: readonly unknown[],
): Promise<QueryResult<R>> {
  const r = await sql.unsafe(text, toParams(params), { prepare: true });
  return { rows: Array.from(r as R[]), rowCount: (r as { count?: number }).count ?? 0 };
}

/** Adapt a postgres.js `sql` instance. `close()` ends it only when `owned` is true (the default). */
export function fromPostgresJs(sql: PostgresJsLike, options: { owned?: boolean } = {}): Db {
  const owned = options.owned ?? true;
  return {
    driver: "postgres",
    query: (text, params) => run(sql, text, params),
    async exec(text: string) {
      await sql.unsafe(text);
    },
    async transaction<T>(fn: (tx: Tx) => Promise<T>, opts?: { begin?: string }): Promise<T> {
      const body = async (tsql: PostgresJsQueryable) => {
        if (opts?.begin) await tsql.unsafe(opts.begin);
        let last: Promise<unknown> | undefined;
        const value = await fn({
          final(text, params) {
            last = run(tsql, text, params);
            last.catch(() => {});
          },
          raw: tsql,
          query: (text, params) => run(tsql, text, params),
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
