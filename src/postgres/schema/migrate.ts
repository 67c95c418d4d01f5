import { readdir, readFile } from "node:fs/promises";
import { SqlState, sqlStateOf } from "../../core/index.ts";
import type { Db } from "../db.ts";
import { isCitus, placeOnCitus } from "./citus.ts";
import { minPartitionSeconds, Partitions } from "./partitions.ts";

/** Where the numbered `.sql` migrations live (the package's `sql/` folder). */
export const MIGRATIONS_DIR = new URL("../../../sql/", import.meta.url);

/** Options of `migrate`. */
export interface MigrateOptions {
  /** The schema idem's tables live in. Default: `"idem"`. */
  schema?: string;
  /**
   * Width of one key partition, in seconds, fixed when the schema is first created (later runs keep
   * the stored value). Default: 86,400 (one day), or the narrowest width that the longest `retentionMs`
   * you will run accepts, when that is wider (`PostgresStore.open` refuses a retention that makes a
   * lookup touch more than `MAX_LIVE_PARTITIONS` partitions).
   */
  partitionSeconds?: number;
  /** The longest retention the stores on this schema will use, to choose the default width. */
  retentionMs?: number;
  /**
   * A database role that runs the service (DML only): granted exactly what idem needs at run time on
   * its tables (`runtimeGrants`), for tables and partitions created later too (default privileges of
   * the role running this, who creates them with `idem migrate` and `idem sweep`). Nothing that allows
   * DDL. The role must exist. Default: none.
   */
  runtimeRole?: string;
  /**
   * The outbox's wake-up trigger, which sends a NOTIFY from inside every transaction that writes an
   * event and is not run by `fromPg`, `fromPostgresJs` or an ORM integration (those send theirs after
   * the commit). Such a NOTIFY makes the commit wait for one lock of the whole cluster, which slows
   * busy writers down (docs/decisions/outbox-notify.md). `false` drops it: relays then learn of those
   * writers' events by polling (give them a short `pollMs`). `true` puts it back. Default: leave it as
   * it is (created by the first migration, dropped on Citus).
   */
  outboxNotify?: boolean;
}

/** What `migrate` did. */
export interface MigrateResult {
  /** Migrations applied by this call (names), oldest first. Empty when the schema was up to date. */
  applied: string[];
  /** On Citus: idem's tables this call distributed or made reference tables (see citus.ts). */
  citus?: string[];
  /**
   * With `runtimeRole`: what that role can still do beyond DML, which a DBA may want to revoke
   * (e.g. `CREATE on schema public`, `superuser`). Empty when it holds nothing more.
   */
  runtimeRoleExtras?: string[];
}

/**
 * idem's schema is older than this version of idem (migrations pending), or missing: run `idem migrate`
 * (`migrate(db)`) as the schema's owner first. The running service does not migrate on its own when its
 * role may not (it has DML rights only).
 */
export class SchemaBehindError extends Error {
  /** Always `"SchemaBehindError"`: the name logs and stack traces show. */
  override name = "SchemaBehindError";
  /** Always `"IDEM_SCHEMA_BEHIND"`: a code to check that does not depend on the class. */
  readonly code = "IDEM_SCHEMA_BEHIND";
  constructor(
    /** The schema that is behind. */
    readonly schema: string,
    /** Names of the migrations not applied (`["all"]` when idem's tables are missing). */
    readonly pending: string[],
    cause?: unknown,
  ) {
    super(
      pending[0] === "all"
        ? `idem's tables are missing in schema "${schema}": run migrate(db) or \`idem migrate\` first`
        : `idem's schema "${schema}" is behind this version of idem (${pending.join(", ")} pending): ` +
            "run `idem migrate` (migrate(db)) as the schema's owner first",
      { cause },
    );
  }
}

const IDENT = /^[a-z_][a-z0-9_]{0,62}$/;

/** The default schema of idem's tables. */
export const DEFAULT_SCHEMA = "idem";

/** The schema an options object names (`schema`, default `idem`), checked to be a plain identifier. */
export function schemaOf(options: { schema?: string }): string {
  return checkSchemaName(options.schema ?? DEFAULT_SCHEMA);
}

export function checkSchemaName(schema: string): string {
  if (!IDENT.test(schema)) {
    throw new Error(`invalid schema name ${JSON.stringify(schema)}: use lower-case letters, digits and _`);
  }
  return schema;
}

interface Migration {
  id: number;
  name: string;
  sql: string;
}

async function loadMigrations(): Promise<Migration[]> {
  const files = (await readdir(MIGRATIONS_DIR)).filter((f) => /^\d+_.+\.sql$/.test(f)).sort();
  return Promise.all(
    files.map(async (name) => ({
      id: Number.parseInt(name, 10),
      name,
      sql: await readFile(new URL(name, MIGRATIONS_DIR), "utf8"),
    })),
  );
}

/**
 * Bring idem's schema up to date, and make the partitions ahead when it changed it. Safe when several
 * instances start at the same moment: the whole run holds a transaction-scoped advisory lock, so one
 * instance migrates and the others then find nothing left to do. Each migration commits together with
 * its row in `<schema>.migrations`. A schema already current costs one read and no DDL, so a service
 * whose role may not create tables can call it at start.
 */
export async function migrate(db: Db, options: MigrateOptions = {}): Promise<MigrateResult> {
  const schema = schemaOf(options);
  const partitionSeconds = Math.trunc(
    options.partitionSeconds ?? Math.max(86_400, minPartitionSeconds(options.retentionMs ?? 0)),
  );
  if (!(partitionSeconds >= 60)) throw new Error("partitionSeconds must be at least 60");
  const role = options.runtimeRole;
  if (role !== undefined) await checkRole(db, role);
  const migrations = await loadMigrations();
  const current = await pendingMigrations(db, { schema }).then(
    (pending) => pending.length === 0,
    () => false, // no schema yet, or not readable: the locked path says what is wrong
  );
  const applied: string[] = current ? [] : await applyMigrations(db, schema, migrations, partitionSeconds);
  // On Citus: idem's tables distributed (keys by scope) or made reference tables (citus.ts).
  const citus = await placeOnCitus(db, schema);
  if (applied.length) await makePartitionsAhead(db, schema, options.retentionMs);
  if (options.outboxNotify !== undefined) await setOutboxNotify(db, schema, options.outboxNotify);
  if (role === undefined) return citus.length ? { applied, citus } : { applied };
  await db.exec(runtimeGrants(schema, role));
  return { applied, ...(citus.length ? { citus } : {}), runtimeRoleExtras: await extrasOf(db, schema, role) };
}

/**
 * Whether the outbox's NOTIFY trigger is in place and enabled (`MigrateOptions.outboxNotify`);
 * undefined when there is no outbox yet.
 */
export async function outboxNotifyTrigger(
  db: Pick<Db, "query">,
  schema: string,
): Promise<boolean | undefined> {
  const { rows } = await db.query<{ outbox: boolean; on: boolean }>(
    `SELECT to_regclass($1) IS NOT NULL AS outbox, EXISTS (
       SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass($1) AND tgname = 'outbox_notify' AND tgenabled <> 'D'
     ) AS on`,
    [`${schema}.outbox`],
  );
  return rows[0]?.outbox ? rows[0].on : undefined;
}

/**
 * Drop or put back the outbox's NOTIFY trigger (`MigrateOptions.outboxNotify`), as sql/0003 made it.
 * DDL only when the trigger is not already as asked: both take a lock on the outbox that waits for its
 * writers, and a service whose role may not change tables can then pass the option at every start.
 * Instances that change it at the same moment tolerate each other.
 */
async function setOutboxNotify(db: Db, schema: string, on: boolean): Promise<void> {
  if ((await outboxNotifyTrigger(db, schema)) === on) return;
  if (!on) {
    await db.exec(`DROP TRIGGER IF EXISTS outbox_notify ON ${schema}.outbox`);
    return;
  }
  if (await isCitus(db)) {
    throw new Error(
      "outboxNotify: true (--outbox-notify on) is refused on Citus: a NOTIFY in a transaction that writes " +
        "on more than one node fails its two-phase commit; relays there find events by polling",
    );
  }
  await db.exec(`DO $$ BEGIN
      CREATE TRIGGER outbox_notify AFTER INSERT ON ${schema}.outbox
        FOR EACH STATEMENT EXECUTE FUNCTION ${schema}.outbox_notify();
    EXCEPTION WHEN duplicate_object THEN NULL; -- another instance created it meanwhile
    END $$`);
}

async function applyMigrations(
  db: Db,
  schema: string,
  migrations: Migration[],
  partitionSeconds: number,
): Promise<string[]> {
  try {
    return await db.transaction(async (tx) => {
      await tx.query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", [`idem:migrate:${schema}`]);
      await tx.exec(
        `CREATE SCHEMA IF NOT EXISTS ${schema};
       CREATE TABLE IF NOT EXISTS ${schema}.migrations (
         id integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
      );
      const done = new Set(
        (await tx.query<{ id: number }>(`SELECT id FROM ${schema}.migrations`)).rows.map((r) => Number(r.id)),
      );
      const names: string[] = [];
      for (const m of migrations) {
        if (done.has(m.id)) continue;
        await tx.exec(
          m.sql
            .replaceAll("{{schema}}", schema)
            .replaceAll("{{partition_seconds}}", String(partitionSeconds)),
        );
        await tx.query(`INSERT INTO ${schema}.migrations (id, name) VALUES ($1, $2)`, [m.id, m.name]);
        names.push(m.name);
      }
      return names;
    });
  } catch (err) {
    if (sqlStateOf(err) !== SqlState.InsufficientPrivilege) throw err;
    // The service's role (DML only) found the schema behind: the owner's job has not run.
    const pending = await pendingMigrations(db, { schema }).catch(() => ["all"]);
    throw new SchemaBehindError(schema, pending.length ? pending : ["all"], err);
  }
}

/** The keys' and the inbox's partitions from the previous one to two days ahead (as `idem sweep`). */
async function makePartitionsAhead(db: Db, schema: string, retentionMs: number | undefined): Promise<void> {
  const { rows } = await db.query<{ partition_seconds: number }>(
    `SELECT partition_seconds FROM ${schema}.settings`,
  );
  const widthMs = Number(rows[0]!.partition_seconds) * 1000;
  const now = Date.now();
  await new Partitions(db, schema, widthMs).makeAhead(now, retentionMs ?? 24 * 3_600_000);
  await new Partitions(db, schema, widthMs, "inbox").makeAhead(now);
}

/** A quoted identifier for a role name (any characters). */
function quoteRole(role: string): string {
  return `"${role.replaceAll('"', '""')}"`;
}

async function checkRole(db: Db, role: string): Promise<void> {
  if (!role) throw new Error("runtimeRole must name a database role");
  const { rows } = await db.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM pg_roles WHERE rolname = $1",
    [role],
  );
  if (!rows[0]?.n) {
    throw new Error(`role ${quoteRole(role)} does not exist: CREATE ROLE ${quoteRole(role)} LOGIN first`);
  }
}

/**
 * What idem's running code needs, and no more: USAGE on the schema; SELECT on `settings` and
 * `migrations`; SELECT, INSERT, UPDATE, DELETE on every other table (keys, outbox, inbox and their
 * partitions, reviews); SELECT and INSERT only on `admin_actions` (the people's actions) and
 * `key_events` (the keys' history), which are append-only;
 * its sequences; and the same on tables and sequences the granting role creates later in the schema
 * (new partitions, new migrations). No CREATE, TRUNCATE, REFERENCES or TRIGGER.
 */
export function runtimeGrants(schema: string, role: string): string {
  const r = quoteRole(role);
  const s = checkSchemaName(schema);
  return `GRANT USAGE ON SCHEMA ${s} TO ${r};
    GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ${s} TO ${r};
    REVOKE INSERT, UPDATE, DELETE ON ${s}.settings, ${s}.migrations FROM ${r};
    REVOKE UPDATE, DELETE ON ${s}.admin_actions, ${s}.key_events FROM ${r};
    GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA ${s} TO ${r};
    ALTER DEFAULT PRIVILEGES IN SCHEMA ${s} GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO ${r};
    ALTER DEFAULT PRIVILEGES IN SCHEMA ${s} GRANT USAGE, SELECT ON SEQUENCES TO ${r};`;
}

/** What `role` may do beyond DML: superuser, owning idem's schema, CREATE on it, the database or public. */
async function extrasOf(db: Db, schema: string, role: string): Promise<string[]> {
  const { rows } = await db.query<Record<string, boolean>>(
    `SELECT r.rolsuper AS superuser,
            pg_get_userbyid(n.nspowner) = r.rolname AS owner,
            has_schema_privilege(r.rolname, $2, 'CREATE') AS schema_create,
            has_database_privilege(r.rolname, current_database(), 'CREATE') AS database_create,
            has_schema_privilege(r.rolname, 'public', 'CREATE') AS public_create
       FROM pg_roles r, pg_namespace n WHERE r.rolname = $1 AND n.nspname = $2`,
    [role, schema],
  );
  const x = rows[0];
  if (!x) return [];
  const extras: string[] = [];
  if (x.superuser) extras.push("superuser");
  if (x.owner) extras.push(`owner of schema ${schema}`);
  else if (x.schema_create) extras.push(`CREATE on schema ${schema}`);
  if (x.database_create) extras.push("CREATE on the database");
  if (x.public_create) extras.push("CREATE on schema public");
  return extras;
}

/** Names of migrations not yet applied (for `idem migrate --check` and start-up errors). */
export async function pendingMigrations(db: Db, options: { schema?: string } = {}): Promise<string[]> {
  const schema = schemaOf(options);
  const migrations = await loadMigrations();
  let done = new Set<number>();
  try {
    done = new Set(
      (await db.query<{ id: number }>(`SELECT id FROM ${schema}.migrations`)).rows.map((r) => Number(r.id)),
    );
  } catch (err) {
    if (sqlStateOf(err) !== SqlState.UndefinedTable) throw err; // nothing applied yet
  }
  return migrations.filter((m) => !done.has(m.id)).map((m) => m.name);
}
