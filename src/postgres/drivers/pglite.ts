import type { Db, QueryResult, Tx } from "../db.ts";

/**
 * The slice of PGlite this adapter uses, typed structurally so `idem/postgres` never imports
 * `@electric-sql/pglite` at run time: a `PGlite` instance satisfies it.
 */
interface PgliteQueryable {
  query<R>(sql: string, params?: any[]): Promise<{ rows: R[]; affectedRows?: number }>;
  exec(sql: string): Promise<unknown>;
}
export interface PgliteLike extends PgliteQueryable {
  transaction<T>(fn: (tx: PgliteQueryable) => Promise<T>): Promise<T>;
  close(): Promise<void>;
}

async function run<R>(
  db: PgliteQueryable,
  sql: string,
  params?: readonly unknown[],
): Promise<QueryResult<R>> {
  const r = await db.query<R>(sql, params ? [...params] : undefined);
  return { rows: r.rows, rowCount: r.affectedRows ?? 0 };
}

/**
 * Adapt a PGlite database (the embedded default). PGlite runs one statement at a time in this process,
 * so a transaction holds the whole database until it ends; concurrent requests queue behind it.
 */
export function fromPglite(pglite: PgliteLike, options: { owned?: boolean } = {}): Db {
  const owned = options.owned ?? true;
  return {
    driver: "pglite",
    query: (sql, params) => run(pglite, sql, params),
    async exec(sql: string) {
      await pglite.exec(sql);
    },
    transaction<T>(fn: (tx: Tx) => Promise<T>, opts?: { begin?: string }): Promise<T> {
      return pglite.transaction(async (t) => {
        if (opts?.begin) await t.exec(opts.begin);
        let last: Promise<unknown> | undefined;
        const value = await fn({
          final(sql, params) {
            last = run(t, sql, params);
            last.catch(() => {});
          },
          raw: t,
          query: (sql, params) => run(t, sql, params),
          async exec(sql: string) {
            await t.exec(sql);
          },
        });
        await last;
        return value;
      });
    },
    async close() {
      if (owned) await pglite.close();
    },
  };
}
