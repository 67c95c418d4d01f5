import { readdir, readFile } from "node:fs/promises";
import { SqlState, sqlStateOf } from "../core/index.ts";
import type { Db } from "./db.ts";
import { minPartitionSeconds } from "./partitions.ts";

/** Where the numbered `.sql` migrations live (the package's `sql/` folder). */
export const MIGRATIONS_DIR = new URL("../../sql/", import.meta.url);

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
}

export interface MigrateResult {
  /** Migrations applied by this call (names), oldest first. Empty when the schema was up to date. */
  applied: string[];
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
 * Bring idem's schema up to date. Safe when several instances start at the same moment: the whole
 * run holds a transaction-scoped advisory lock, so one instance migrates and the others then find
 * nothing left to do. Each migration commits together with its row in `<schema>.migrations`.
 */
export async function migrate(db: Db, options: MigrateOptions = {}): Promise<MigrateResult> {
  const schema = schemaOf(options);
  const partitionSeconds = Math.trunc(
    options.partitionSeconds ?? Math.max(86_400, minPartitionSeconds(options.retentionMs ?? 0)),
  );
  if (!(partitionSeconds >= 60)) throw new Error("partitionSeconds must be at least 60");
  const migrations = await loadMigrations();
  return db.transaction(async (tx) => {
    await tx.query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", [`idem:migrate:${schema}`]);
    await tx.exec(
      `CREATE SCHEMA IF NOT EXISTS ${schema};
       CREATE TABLE IF NOT EXISTS ${schema}.migrations (
         id integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
    );
    const done = new Set(
      (await tx.query<{ id: number }>(`SELECT id FROM ${schema}.migrations`)).rows.map((r) => Number(r.id)),
    );
    const applied: string[] = [];
    for (const m of migrations) {
      if (done.has(m.id)) continue;
      await tx.exec(
        m.sql.replaceAll("{{schema}}", schema).replaceAll("{{partition_seconds}}", String(partitionSeconds)),
      );
      await tx.query(`INSERT INTO ${schema}.migrations (id, name) VALUES ($1, $2)`, [m.id, m.name]);
      applied.push(m.name);
    }
    return { applied };
  });
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
