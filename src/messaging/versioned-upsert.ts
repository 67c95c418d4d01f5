/**
 * Versioned upserts for full-state events ("product 1 now costs 1500, version 6"): a row changes only
 * when the event's version is newer than the stored one. A repeated event and one that arrives after
 * a newer one change nothing, so no inbox is needed, and out-of-order delivery is harmless too.
 *
 * Only for events that carry the whole new state. An event that describes a change ("add 500") must go
 * through the inbox: skipping an older version of it would lose the change.
 */
import type { Queryable } from "../core/db.ts";

/** A row written only when the event's version is newer than the stored one (see `versionedUpsert`). */
export interface VersionedUpsert {
  /** The table, optionally schema-qualified: `"products"` or `"shop.products"`. */
  table: string;
  /** The row's identity: column -> value. Must match a unique index or primary key of the table. */
  key: Record<string, unknown>;
  /**
   * The event's version of the row: a number that grows with every change of it, or a time (the
   * event's creation time, for a `timestamptz` version column) when the sender gives no version.
   */
  version: number | bigint | Date;
  /** The full new state: column -> value (key and version columns excluded). */
  values: Record<string, unknown>;
  /** The version column. Default `"version"`. */
  versionColumn?: string;
}

const IDENT = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;

function ident(name: string): string {
  if (!IDENT.test(name)) throw new TypeError(`not a plain SQL identifier: ${JSON.stringify(name)}`);
  return `"${name}"`;
}

function tableName(name: string): string {
  return name.split(".").map(ident).join(".");
}

/**
 * Insert the row, or update it if the stored version is older:
 * `INSERT ... ON CONFLICT (key) DO UPDATE SET ... WHERE stored.version < new.version`.
 * Resolves true when the row was written, false when the stored version was the same or newer.
 */
export async function versionedUpsert(db: Queryable, u: VersionedUpsert): Promise<boolean> {
  const keyCols = Object.keys(u.key);
  const valueCols = Object.keys(u.values);
  if (keyCols.length === 0) throw new TypeError("versionedUpsert needs at least one key column");
  const version = ident(u.versionColumn ?? "version");
  const table = tableName(u.table);
  const cols = [...keyCols, ...valueCols].map(ident);
  const params = [...keyCols.map((k) => u.key[k]), ...valueCols.map((k) => u.values[k]), u.version];
  const placeholders = params.map((_, i) => `$${i + 1}`);
  const updates = [...valueCols.map(ident), version].map((c) => `${c} = EXCLUDED.${c}`);
  // The alias keeps the WHERE unambiguous whatever the table is called.
  const sql = `INSERT INTO ${table} AS stored (${[...cols, version].join(", ")})
    VALUES (${placeholders.join(", ")})
    ON CONFLICT (${keyCols.map(ident).join(", ")}) DO UPDATE SET ${updates.join(", ")}
    WHERE stored.${version} < EXCLUDED.${version}`;
  const { rowCount } = await db.query(sql, params.map(toParam));
  return rowCount > 0;
}

function toParam(v: unknown): unknown {
  if (v instanceof Date) return v.toISOString();
  return typeof v === "bigint" ? v.toString() : v;
}
