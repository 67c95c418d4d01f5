/**
 * Intents in PostgreSQL: the outgoing call is recorded in the caller's own database, ideally in the
 * same transaction as the business row that made it necessary (the order, the payout). If the
 * process dies after that commit, `client.pending()` finds the call and its key after the restart.
 * Import from `idem/client/postgres`. Takes any `Queryable` (a `Db` or a `Tx` from `idem/postgres`,
 * or your own adapter) and imports no driver.
 *
 * ```ts
 * const intents = new PostgresIntentStore(db);
 * await intents.install();
 * await db.transaction(async (tx) => {
 *   await tx.query("INSERT INTO orders (id, total) VALUES ($1, $2)", ["order-42", 5000]);
 *   await intents.using(tx).create(newIntentRecord("order-42")); // key committed with the order
 * });
 * ```
 */

import type { Queryable } from "../core/db.ts";
import { SqlState, sqlStateOf } from "../core/sqlstate.ts";
import type { IntentAnswer, IntentRecord, IntentStatus, IntentStore, StoredRequest } from "./intent-store.ts";

/** What a concurrent CREATE ... IF NOT EXISTS fails with when another connection created it first. */
const CONCURRENT_CREATE = new Set<string>([
  SqlState.UniqueViolation,
  SqlState.DuplicateSchema,
  SqlState.DuplicateTable,
]);

/** Options of {@link PostgresIntentStore}. */
export interface PostgresIntentStoreOptions {
  /** Schema holding the table (created by `install()`). Default `"idem"`. */
  schema?: string;
  /** Table name. Default `"client_intents"`. */
  table?: string;
}

interface Row {
  id: string;
  key: string;
  status: string;
  request: unknown;
  attempts: number | string;
  outcome_status: number | null;
  created_at: Date | string;
  updated_at: Date | string;
  expires_at: Date | string | null;
  last_answer: unknown;
}

const COLUMNS =
  "id, key, status, request, attempts, outcome_status, created_at, updated_at, expires_at, last_answer";
const VALUES = "$1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10::jsonb";
const STATUSES = "'pending', 'done', 'abandoned', 'uncertain'";

/** Intents in a PostgreSQL table (`install()` creates it): shared by every process of the caller. */
export class PostgresIntentStore implements IntentStore {
  readonly #db: Queryable;
  readonly #options: PostgresIntentStoreOptions;
  readonly #schema: string;
  readonly #table: string;

  constructor(db: Queryable, options: PostgresIntentStoreOptions = {}) {
    this.#db = db;
    this.#options = options;
    this.#schema = ident(options.schema ?? "idem");
    this.#table = `${this.#schema}.${ident(options.table ?? "client_intents")}`;
  }

  /** The same table through another connection, e.g. the transaction that writes your business row. */
  using(db: Queryable): PostgresIntentStore {
    return new PostgresIntentStore(db, this.#options);
  }

  /**
   * Create the schema, table and index if missing, and bring a table made by an older version up to
   * date (the `expires_at` and `last_answer` columns, the `uncertain` status). Safe to call on every
   * start, concurrently.
   */
  async install(): Promise<void> {
    const tableName = this.#options.table ?? "client_intents";
    const check = ident(`${tableName}_status_check`);
    const statements = [
      `CREATE SCHEMA IF NOT EXISTS ${this.#schema}`,
      `CREATE TABLE IF NOT EXISTS ${this.#table} (
        id text PRIMARY KEY,
        key text NOT NULL UNIQUE,
        status text NOT NULL CONSTRAINT ${check} CHECK (status IN (${STATUSES})),
        request jsonb,
        attempts integer NOT NULL DEFAULT 0,
        outcome_status integer,
        created_at timestamptz NOT NULL,
        updated_at timestamptz NOT NULL,
        expires_at timestamptz,
        last_answer jsonb
      )`,
      `ALTER TABLE ${this.#table} ADD COLUMN IF NOT EXISTS expires_at timestamptz,
        ADD COLUMN IF NOT EXISTS last_answer jsonb`,
      `CREATE INDEX IF NOT EXISTS ${ident(`${tableName}_pending`)}
        ON ${this.#table} (created_at) WHERE status = 'pending'`,
    ];
    for (const sql of statements) {
      // Two processes running IF NOT EXISTS at once can still collide on the catalog; the loser's
      // object exists by the time it retries.
      try {
        await this.#db.query(sql);
      } catch (err) {
        if (!CONCURRENT_CREATE.has(sqlStateOf(err) ?? "")) throw err;
        await this.#db.query(sql);
      }
    }
    // Tables from before the `uncertain` status: widen the check (once; later starts only look).
    const { rows } = await this.#db.query<{ def: string }>(
      `SELECT pg_get_constraintdef(oid) AS def FROM pg_constraint
        WHERE conrelid = $1::regclass AND conname = $2`,
      [this.#table, `${tableName}_status_check`],
    );
    if (!rows[0]?.def.includes("uncertain")) {
      await this.#db.query(
        `ALTER TABLE ${this.#table} DROP CONSTRAINT IF EXISTS ${check},
          ADD CONSTRAINT ${check} CHECK (status IN (${STATUSES}))`,
      );
    }
  }

  /** Alias of {@link install}. */
  ensureSchema(): Promise<void> {
    return this.install();
  }

  /** Insert `record` unless an intent with its id exists; resolve to whichever record is stored. */
  async create(record: IntentRecord): Promise<IntentRecord> {
    const inserted = await this.#db.query<Row>(
      `INSERT INTO ${this.#table} (${COLUMNS}) VALUES (${VALUES})
       ON CONFLICT (id) DO NOTHING RETURNING ${COLUMNS}`,
      params(record),
    );
    if (inserted.rows[0]) return fromRow(inserted.rows[0]);
    const existing = await this.get(record.id);
    if (!existing) throw new Error(`PostgresIntentStore: intent ${record.id} vanished during create`);
    return existing;
  }

  /** The record with this id, or undefined. */
  async get(id: string): Promise<IntentRecord | undefined> {
    const { rows } = await this.#db.query<Row>(`SELECT ${COLUMNS} FROM ${this.#table} WHERE id = $1`, [id]);
    return rows[0] && fromRow(rows[0]);
  }

  /** Replace the stored record with this id (insert it if missing). */
  async save(record: IntentRecord): Promise<void> {
    await this.#db.query(
      `INSERT INTO ${this.#table} (${COLUMNS}) VALUES (${VALUES})
       ON CONFLICT (id) DO UPDATE SET key = EXCLUDED.key, status = EXCLUDED.status,
         request = EXCLUDED.request, attempts = EXCLUDED.attempts,
         outcome_status = EXCLUDED.outcome_status, created_at = EXCLUDED.created_at,
         updated_at = EXCLUDED.updated_at, expires_at = EXCLUDED.expires_at,
         last_answer = EXCLUDED.last_answer`,
      params(record),
    );
  }

  /** Every record, or those with the given status, oldest first. */
  async list(filter: { status?: IntentStatus } = {}): Promise<IntentRecord[]> {
    const { rows } = filter.status
      ? await this.#db.query<Row>(
          `SELECT ${COLUMNS} FROM ${this.#table} WHERE status = $1 ORDER BY created_at, id`,
          [filter.status],
        )
      : await this.#db.query<Row>(`SELECT ${COLUMNS} FROM ${this.#table} ORDER BY created_at, id`);
    return rows.map(fromRow);
  }

  /** Remove the record with this id (nothing when there is none). */
  async delete(id: string): Promise<void> {
    await this.#db.query(`DELETE FROM ${this.#table} WHERE id = $1`, [id]);
  }
}

function ident(name: string): string {
  if (!/^[A-Za-z_][A-Za-z0-9_]{0,62}$/.test(name)) {
    throw new TypeError(`PostgresIntentStore: ${JSON.stringify(name)} is not a plain SQL identifier`);
  }
  return `"${name}"`;
}

function params(r: IntentRecord): unknown[] {
  return [
    r.id,
    r.key,
    r.status,
    r.request ? JSON.stringify(r.request) : null,
    r.attempts,
    r.outcome?.status ?? null,
    r.createdAt,
    r.updatedAt,
    r.expiresAt ?? null,
    r.lastAnswer ? JSON.stringify(r.lastAnswer) : null,
  ];
}

function fromRow(row: Row): IntentRecord {
  const request = typeof row.request === "string" ? JSON.parse(row.request) : row.request;
  const record: IntentRecord = {
    id: row.id,
    key: row.key,
    status: row.status as IntentStatus,
    attempts: Number(row.attempts),
    createdAt: iso(row.created_at),
    updatedAt: iso(row.updated_at),
  };
  if (request) record.request = request as StoredRequest;
  if (row.outcome_status !== null) {
    record.outcome = { status: Number(row.outcome_status) };
  }
  if (row.expires_at !== null) record.expiresAt = iso(row.expires_at);
  const answer = typeof row.last_answer === "string" ? JSON.parse(row.last_answer) : row.last_answer;
  if (answer) record.lastAnswer = answer as IntentAnswer;
  return record;
}

function iso(v: Date | string): string {
  return (v instanceof Date ? v : new Date(v)).toISOString();
}
