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

/** Another process has the embedded database directory open. */
export class DataDirInUseError extends Error {
  readonly code = "IDEM_DATA_DIR_IN_USE";
  constructor(readonly dir: string) {
    super(
      `the embedded database in ${dir} is open in another process (an idem service or command): stop it, ` +
        `or give this one a directory of its own (IDEM_DATA_DIR) or a PostgreSQL server (DATABASE_URL)`,
    );
    this.name = "DataDirInUseError";
  }
}

/**
 * Take the embedded database directory `dir` for this process, before opening PGlite on it: PGlite is
 * PostgreSQL in one process, and two processes writing one directory corrupt it. The lock is
 * `<dir>.lock`, kept fresh while the process lives and taken over once stale (10 s), so a killed
 * process does not leave the directory locked for long. Resolves to the function that releases it;
 * rejects with {@link DataDirInUseError} while another live process holds it.
 *
 * proper-lockfile rather than a hand-written pid file: it creates the lock atomically (mkdir), refreshes
 * it, and detects stale locks, which is the part that is easy to get wrong.
 */
export async function lockDataDir(
  dir: string,
  options: { onCompromised?: (err: Error) => void } = {},
): Promise<() => Promise<void>> {
  const { default: lockfile } = await import("proper-lockfile");
  try {
    return await lockfile.lock(dir, {
      stale: 10_000,
      update: 5_000,
      retries: 0,
      // A lost lock (its refresh failed for longer than `stale`) is reported, not thrown from a timer.
      onCompromised: options.onCompromised ?? (() => {}),
    });
  } catch (err) {
    if ((err as { code?: string }).code === "ELOCKED") throw new DataDirInUseError(dir);
    throw err;
  }
}

/**
 * Open the PGlite database persisted in `dir` (created if missing) for this process alone: the
 * directory is locked first ({@link lockDataDir}), and `db.close()` closes PGlite, then lets go of the
 * lock. `pglite` is the instance itself (e.g. for LISTEN). Needs `@electric-sql/pglite` installed.
 */
export async function openPgliteDir(
  dir: string,
  options: { onCompromised?: (err: Error) => void } = {},
): Promise<{
  db: Db;
  pglite: PgliteLike & {
    listen(channel: string, fn: (payload: string) => void): Promise<() => Promise<void>>;
  };
}> {
  const { mkdirSync } = await import("node:fs");
  mkdirSync(dir, { recursive: true });
  const release = await lockDataDir(dir, options);
  try {
    const { PGlite } = await import("@electric-sql/pglite");
    const pglite = await PGlite.create(dir);
    const opened = fromPglite(pglite);
    const db: Db = {
      ...opened,
      async close() {
        await opened.close();
        await release();
      },
    };
    return { db, pglite };
  } catch (err) {
    await release();
    throw err;
  }
}
