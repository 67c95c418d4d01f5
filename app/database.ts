/**
 * Opens the service's database: the PostgreSQL server at DATABASE_URL, or the embedded PGlite persisted
 * under `.idem/pgdata` (the default for `npm start`, so the service runs with nothing installed).
 */
import { type Listen, listenWithPg, listenWithPglite } from "idem/messaging";
import { type Db, fromPg, migrate, openPgliteDir } from "idem/postgres";
import type { PoolConfig } from "pg";
import { PATTERN_TABLES } from "./patterns.ts";

export interface OpenedDatabase {
  db: Db;
  /** LISTEN on a dedicated connection, to wake the outbox relay as soon as an event is written. */
  listen: Listen;
  embedded: boolean;
  /** Where it lives, for the start-up banner (no password). */
  where: string;
}

export async function openDatabase(options: {
  url?: string;
  dataDir?: string;
  poolSize?: number;
}): Promise<OpenedDatabase> {
  if (options.url) {
    let parsed: URL;
    try {
      parsed = new URL(options.url);
    } catch {
      throw new Error(`DATABASE_URL is not a URL: set it like postgres://user@127.0.0.1:5432/dbname`);
    }
    const { default: pg } = await import("pg");
    // Pipeline mode lets node-postgres send BEGIN with the first statement and the last statement with
    // COMMIT, which takes two round trips off every keyed request (see PostgresStore.atomic).
    const pool = new pg.Pool({
      connectionString: options.url,
      max: options.poolSize ?? 20,
      pipeline: true,
    } as PoolConfig);
    // An idle connection that dies (the server restarted) is reported on the pool: without a listener
    // Node would crash the service. The pool replaces it on the next checkout.
    pool.on("error", (err) => {
      console.error(JSON.stringify({ level: 50, msg: "idle database connection lost", err: err.message }));
    });
    const db = fromPg(pool);
    try {
      await db.query("SELECT 1");
    } catch (err) {
      await db.close().catch(() => {});
      throw new Error(
        `cannot reach PostgreSQL at ${parsed.host}${parsed.pathname} (${(err as Error).message}): start it, or unset DATABASE_URL to use the embedded database`,
        { cause: err },
      );
    }
    parsed.password = "";
    return {
      db,
      listen: listenWithPg(() => pool.connect()),
      embedded: false,
      where: `${parsed.host}${parsed.pathname}`,
    };
  }
  const dataDir = options.dataDir ?? ".idem/pgdata";
  // Locked before PGlite touches it: a second `npm start` (or `idem sweep`) on it would corrupt it.
  const { db, pglite } = await openPgliteDir(dataDir, {
    onCompromised: (err) =>
      console.error(
        JSON.stringify({ level: 50, msg: "lost the lock on the data directory", err: err.message }),
      ),
  });
  return { db, listen: listenWithPglite(pglite), embedded: true, where: `embedded PGlite in ${dataDir}` };
}

/** idem's own migrations, then the service's tables (idempotent DDL under an advisory lock). */
export async function prepareSchema(db: Db): Promise<void> {
  await migrate(db);
  await db.transaction(async (tx) => {
    await tx.query("SELECT pg_advisory_xact_lock(hashtextextended('idem:app-schema', 0))");
    await tx.exec(`
      CREATE TABLE IF NOT EXISTS accounts (
        id         text PRIMARY KEY,
        name       text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
      );
      CREATE TABLE IF NOT EXISTS api_keys (
        key_hash   bytea PRIMARY KEY,          -- SHA-256 of the API key; the key itself is never stored
        account_id text NOT NULL REFERENCES accounts(id),
        created_at timestamptz NOT NULL DEFAULT now()
      );
      CREATE TABLE IF NOT EXISTS payments (
        id           text PRIMARY KEY,
        account_id   text NOT NULL REFERENCES accounts(id),
        amount_cents bigint NOT NULL CHECK (amount_cents > 0),
        currency     text NOT NULL,
        status       text NOT NULL,
        created_at   timestamptz NOT NULL DEFAULT clock_timestamp()
      );
      CREATE INDEX IF NOT EXISTS payments_account_created ON payments (account_id, created_at DESC);
    `);
    await tx.exec(PATTERN_TABLES);
  });
}
