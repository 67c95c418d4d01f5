import type { Db, QueryResult, Tx } from "../db.ts";

/**
 * The slice of PGlite this adapter uses, typed structurally so `idem/postgres` never imports
 * `@electric-sql/pglite` at run time: a `PGlite` instance satisfies it.
 */
export interface PgliteQueryable {
  query<R>(sql: string, params?: any[]): Promise<{ rows: R[]; affectedRows?: number }>;
  exec(sql: string): Promise<unknown>;
}
/** What `fromPglite` needs of a `PGlite` instance (typed structurally: not imported at run time). */
export interface PgliteLike extends PgliteQueryable {
  /** Run `fn` in one transaction. */
  transaction<T>(fn: (tx: PgliteQueryable) => Promise<T>): Promise<T>;
  /** Close the database. */
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
    supportsBeginParams: true,
    transaction<T>(
      fn: (tx: Tx) => Promise<T>,
      opts?: { begin?: string | { sql: string; params?: readonly unknown[] } },
    ): Promise<T> {
      const begin = opts?.begin;
      return pglite.transaction(async (t) => {
        if (typeof begin === "string") {
          if (begin) await t.exec(begin);
        } else if (begin) await run(t, begin.sql, begin.params);
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
  /** Always `"IDEM_DATA_DIR_IN_USE"`: a code to check that does not depend on the class. */
  readonly code = "IDEM_DATA_DIR_IN_USE";
  constructor(
    /** The database directory. */
    readonly dir: string,
  ) {
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
 * PostgreSQL settings for an embedded database: a small buffer cache (PGlite's WebAssembly memory
 * never shrinks, and the server's default 128 MB of shared buffers is sized for a dedicated machine).
 * About a quarter of the memory of the defaults: docs/decisions/embedded-database-memory.md.
 */
export const EMBEDDED_POSTGRESQL_CONF = "shared_buffers = 16MB\nwork_mem = 2MB\nmaintenance_work_mem = 16MB";

/**
 * Create the data directory in a short-lived child process. PGlite's initdb grows the WebAssembly
 * memory far beyond what a running database needs, and the process keeps it for as long as it lives;
 * opening a directory that already exists needs a fraction of it. So a new directory is initialised
 * elsewhere and only opened here (docs/decisions/embedded-database-memory.md).
 */
async function initializeInChild(dir: string): Promise<void> {
  const { spawn } = await import("node:child_process");
  // Resolved from here (not from the working directory); import.meta.resolve is missing under some
  // loaders (vitest), where require's resolution finds the same package.
  const metaResolve = (import.meta as { resolve?: (specifier: string) => string }).resolve;
  let pglite: string;
  if (typeof metaResolve === "function") pglite = metaResolve("@electric-sql/pglite");
  else {
    const { createRequire } = await import("node:module");
    const { pathToFileURL } = await import("node:url");
    pglite = pathToFileURL(createRequire(import.meta.url).resolve("@electric-sql/pglite")).href;
  }
  const script = `const { PGlite } = await import(${JSON.stringify(pglite)}); const db = await PGlite.create(${JSON.stringify(dir)}); await db.close();`;
  await new Promise<void>((resolve, reject) => {
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    let err = "";
    child.stderr!.on("data", (d) => {
      err += d;
    });
    child.once("error", reject);
    child.once("exit", (code) =>
      code === 0
        ? resolve()
        : reject(new Error(`initialising the embedded database in ${dir} failed: ${err.trim()}`)),
    );
  });
}

/**
 * Open the PGlite database persisted in `dir` (created if missing) for this process alone: the
 * directory is locked first ({@link lockDataDir}), and `db.close()` closes PGlite, then lets go of the
 * lock. `pglite` is the instance itself (e.g. for LISTEN). Needs `@electric-sql/pglite` installed.
 *
 * Memory: a new directory is initialised in a child process, and the database runs with
 * {@link EMBEDDED_POSTGRESQL_CONF} unless `postgresqlconf` says otherwise.
 */
export async function openPgliteDir(
  dir: string,
  options: { onCompromised?: (err: Error) => void; postgresqlconf?: string } = {},
): Promise<{
  db: Db;
  pglite: PgliteLike & {
    listen(channel: string, fn: (payload: string) => void): Promise<() => Promise<void>>;
  };
}> {
  const { PGlite } = await import("@electric-sql/pglite");
  const { existsSync, mkdirSync } = await import("node:fs");
  const { join } = await import("node:path");
  mkdirSync(dir, { recursive: true });
  const release = await lockDataDir(dir, options);
  try {
    if (!existsSync(join(dir, "PG_VERSION"))) await initializeInChild(dir);
    const pglite = await PGlite.create(dir, {
      postgresqlconf: options.postgresqlconf ?? EMBEDDED_POSTGRESQL_CONF,
    });
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
