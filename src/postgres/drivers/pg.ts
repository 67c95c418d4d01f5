import type { Db, QueryResult, Tx } from "../db.ts";

/**
 * The slice of node-postgres this adapter uses, typed structurally so `idem/postgres` never imports `pg`
 * at run time: a `pg.Pool` satisfies it.
 */
export interface PgPoolLike {
  query(text: string, values?: unknown[]): Promise<{ rows: any[]; rowCount: number | null }>;
  connect(): Promise<PgClientLike>;
  end(): Promise<void>;
}
export interface PgClientLike {
  query(text: string, values?: unknown[]): Promise<{ rows: any[]; rowCount: number | null }>;
  release(err?: boolean | Error): void;
}

function toParams(params: readonly unknown[] | undefined): unknown[] | undefined {
  if (!params) return undefined;
  // node-postgres sends Buffers as bytea but not plain Uint8Arrays.
  return params.map((p) => (p instanceof Uint8Array && !Buffer.isBuffer(p) ? Buffer.from(p) : p));
}

function result<R>(r: { rows: any[]; rowCount: number | null }): QueryResult<R> {
  return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
}

/** Adapt a node-postgres `Pool`. `close()` ends the pool only when `owned` is true (the default). */
export function fromPg(pool: PgPoolLike, options: { owned?: boolean } = {}): Db {
  const owned = options.owned ?? true;
  return {
    driver: "pg",
    async query<R>(sql: string, params?: readonly unknown[]) {
      return result<R>(await pool.query(sql, toParams(params)));
    },
    async exec(sql: string) {
      await pool.query(sql);
    },
    async transaction<T>(fn: (tx: Tx) => Promise<T>, opts?: { begin?: string }): Promise<T> {
      const client = await pool.connect();
      let broken = false;
      try {
        // No parameters, so node-postgres uses the simple protocol and BEGIN plus the extra SQL
        // travel in one round trip.
        await client.query(opts?.begin ? `BEGIN; ${opts.begin}` : "BEGIN");
        const tx: Tx = {
          raw: client,
          async exec(sql: string) {
            await client.query(sql);
          },
          async query<R>(sql: string, params?: readonly unknown[]) {
            return result<R>(await client.query(sql, toParams(params)));
          },
        };
        try {
          const value = await fn(tx);
          await client.query("COMMIT");
          return value;
        } catch (err) {
          await client.query("ROLLBACK").catch(() => {
            broken = true;
          });
          throw err;
        }
      } catch (err) {
        if (isConnectionError(err)) broken = true;
        throw err;
      } finally {
        client.release(broken);
      }
    },
    async close() {
      if (owned) await pool.end();
    },
  };
}

function isConnectionError(err: unknown): boolean {
  const code = (err as { code?: string })?.code;
  return code === undefined || code === "ECONNRESET" || code === "57P01" || code === "EPIPE";
}
