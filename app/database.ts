/**
 * Opens the service's database: the PostgreSQL server at DATABASE_URL, or the embedded PGlite persisted
 * under `.idem/pgdata` (the default for `npm start`, so the service runs with nothing installed).
 */

import { type Listen, listenWithPglite } from "idem/messaging";
import {
  DatabaseConnectError,
  type Db,
  migrate,
  openDatabaseUrl,
  openPgliteDir,
  pendingMigrations,
  SchemaBehindError,
} from "idem/postgres";
import { placeAppOnCitus } from "./citus.ts";
import { PATTERN_TABLES } from "./patterns.ts";
import { PROVIDER_WEBHOOK_TABLES } from "./provider-webhooks.ts";
import { RECEIPT_TABLES } from "./receipts.ts";

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
  /** Straight to PostgreSQL, for LISTEN when `url` goes through a pooler (IDEM_LISTEN_DATABASE_URL). */
  listenUrl?: string;
  /** pg, postgres or auto (IDEM_DB_DRIVER; auto: postgres.js for several hosts). */
  driver?: "pg" | "postgres" | "auto";
}): Promise<OpenedDatabase> {
  if (options.url) {
    try {
      // Pipeline mode lets node-postgres send BEGIN with the first statement and the last statement
      // with COMMIT, which takes two round trips off every keyed request (see PostgresStore.atomic).
      // A URL with several hosts (`target_session_attrs=read-write`) runs on postgres.js.
      const opened = await openDatabaseUrl(options.url, {
        max: options.poolSize ?? 20,
        pipeline: true,
        driver: options.driver,
        listenUrl: options.listenUrl,
        // An idle connection that dies (the server restarted) is reported: the pool replaces it.
        onIdleError: (err) =>
          console.error(
            JSON.stringify({ level: 50, msg: "idle database connection lost", err: err.message }),
          ),
      });
      return { db: opened.db, listen: opened.listen, embedded: false, where: opened.where };
    } catch (err) {
      if (err instanceof DatabaseConnectError && err.kind === "unreachable") {
        throw new Error(`${err.message}: start it, or unset DATABASE_URL to use the embedded database`, {
          cause: err,
        });
      }
      if (err instanceof TypeError) throw new Error(`DATABASE_URL is ${err.message}`, { cause: err });
      throw err;
    }
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

/**
 * The version of the service's own tables (below and app/receipts.ts, app/patterns.ts): bump it with
 * every change to their DDL, so that a service whose role may not run DDL sees it is behind.
 */
const APP_SCHEMA_VERSION = 2;

/** The service's tables are older than this code (or missing), and this role may not bring them up. */
export class AppSchemaBehindError extends Error {
  override name = "AppSchemaBehindError";
  constructor(cause: unknown) {
    super(
      "the service's tables are behind this version and this database role may not migrate them: " +
        "run `npm run payments -- migrate --runtime-role <this role>` as their owner first",
      { cause },
    );
  }
}

/** Whether idem's schema and the service's tables are current (then starting runs no DDL). */
export async function schemaIsCurrent(db: Db): Promise<boolean> {
  try {
    if ((await pendingMigrations(db)).length) return false;
    const { rows } = await db.query<{ version: number }>("SELECT version FROM app_schema");
    return Number(rows[0]?.version) >= APP_SCHEMA_VERSION;
  } catch {
    return false; // missing (or not readable): the migration says what is wrong
  }
}

/**
 * At start: nothing when the schema is current (the service's role needs DML only); otherwise migrate
 * it, which needs the owner's rights (`AppSchemaBehindError` naming the command for a role without).
 */
export async function ensureSchema(db: Db): Promise<void> {
  if (await schemaIsCurrent(db)) return;
  try {
    await prepareSchema(db);
  } catch (err) {
    if (err instanceof SchemaBehindError || (err as { code?: string }).code === "42501") {
      throw new AppSchemaBehindError(err);
    }
    throw err;
  }
}

/**
 * idem's own migrations, then the service's tables (idempotent DDL under an advisory lock): the
 * owner's job (`npm run payments -- migrate`). With `runtimeRole`, that role is granted DML on them and
 * on idem's tables, nothing that allows DDL.
 */
export async function prepareSchema(db: Db, options: { runtimeRole?: string } = {}): Promise<string[]> {
  const { runtimeRoleExtras } = await migrate(db, { runtimeRole: options.runtimeRole });
  await db.transaction(async (tx) => {
    await tx.query("SELECT pg_advisory_xact_lock(hashtextextended('idem:app-schema', 0))");
    await tx.exec(APP_TABLES);
    await tx.exec(
      `CREATE TABLE IF NOT EXISTS app_schema (id boolean PRIMARY KEY DEFAULT true CHECK (id), version integer NOT NULL);
       INSERT INTO app_schema (version) VALUES (${APP_SCHEMA_VERSION})
         ON CONFLICT (id) DO UPDATE SET version = GREATEST(app_schema.version, EXCLUDED.version)`,
    );
    if (options.runtimeRole) {
      const role = `"${options.runtimeRole.replaceAll('"', '""')}"`;
      await tx.exec(
        `GRANT SELECT, INSERT, UPDATE, DELETE ON ${APP_TABLE_NAMES.join(", ")} TO ${role};
         GRANT SELECT ON app_schema TO ${role}`,
      );
    }
  });
  // On Citus: the business tables distributed by account, colocated with idem's keys (app/citus.ts).
  await placeAppOnCitus(db);
  return runtimeRoleExtras ?? [];
}

const APP_TABLES = `
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
  -- Phases mode: what the provider knows the payment by (the downstream reference, <account>:<claim
  -- id>) and the client's key, for idem reconcile (app/reconcile.json). Version 2.
  ALTER TABLE payments ADD COLUMN IF NOT EXISTS provider_ref text;
  ALTER TABLE payments ADD COLUMN IF NOT EXISTS idempotency_key text;
  CREATE INDEX IF NOT EXISTS payments_created ON payments (created_at);
  ${PATTERN_TABLES}
  ${RECEIPT_TABLES}
  ${PROVIDER_WEBHOOK_TABLES}
`;

/** The service's tables, read off their DDL (so that a new one is granted too). */
const APP_TABLE_NAMES = [...APP_TABLES.matchAll(/CREATE TABLE IF NOT EXISTS (\w+)/g)].map((m) => m[1]!);
