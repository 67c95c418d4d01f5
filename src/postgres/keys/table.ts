/**
 * The keys table as both modes and the operator tools see it: the table of the database a scope's keys
 * live in. A `PostgresStore` is one such table; a `ShardedStore` routes each scope to one of its
 * shards'. The phases runner, the completer and inspection reach the store through this interface only.
 */
import {
  type AtomicStore,
  isMissingPartition,
  type KeyInspection,
  type OperationRefCodec,
  type Sealer,
} from "../../core/index.ts";
import type { Db, Tx } from "../db.ts";
import type { DbTime } from "./db-time.ts";
import { liveRow } from "./live.ts";

/** One database's keys table (a `PostgresStore` is one). */
export interface KeyTable {
  /** The database the table is in. */
  readonly db: Db;
  /** The schema idem's tables live in. */
  readonly schema: string;
  /** How long a key is kept, in ms; after it the same key is new. */
  readonly retentionMs: number;
  /** How long a local phase waits for a row lock before it gives up (retryable). */
  readonly lockTimeoutMs: number;
  /** Claims made this soon after a partition starts also mark the previous partition. */
  readonly boundaryOverlapMs: number;
  /** @internal The time its statements read: the database's clock (`now()`), moved by the time shift. */
  readonly dbTime: DbTime;
  /** Seals saved bodies and stored inputs at rest (`PostgresStoreOptions.sealer`); none: in clear. */
  readonly sealer?: Sealer | undefined;
  /** Seals the operation references of its keys (`PostgresStore.refs`). */
  readonly refs?: OperationRefCodec | undefined;
  /** Make sure the partitions around the database's now exist. */
  ensurePartitions(): Promise<void>;
  /**
   * This process's estimate of the database's time, in epoch ms: a hint that names the partitions a
   * claim reads (the statement checks it against the database's clock). Without it, every claim works
   * out its partitions from the database's clock.
   */
  estimatedNowMs?(): number;
}

/**
 * A store of keys in one table, as the modes built on it see it (a `PostgresStore` is one): its table,
 * its clock and the requests it serves. Modes take this, never the store's class.
 */
export interface KeyStore extends KeyTable {
  /** Seals the operation references of its keys. */
  readonly refs: OperationRefCodec;
  /** @internal Whether the keys table is distributed with Citus (its lock is taken on the key's shard). */
  readonly distributed: boolean;
  /** @internal This process's estimate of the database's time, in epoch ms (keys/clock.ts): a hint. */
  estimatedNowMs(): number;
  /** One key as an operator sees it, or undefined when it is not live. */
  inspect(scope: string, key: string): Promise<KeyInspection | undefined>;
  /** A plain transaction for user code. */
  transaction<T>(work: (tx: Tx) => Promise<T>): Promise<T>;
}

/** Several keys tables, one per shard, with the scope's route (a `ShardedStore` is one). */
export interface ShardedKeyTables {
  /** How long a key is kept, in ms (the same on every shard). */
  readonly retentionMs: number;
  /** The shards by name. */
  readonly shards: Readonly<Record<string, KeyTable>>;
  /** The shard a scope's keys live on. */
  shardOf(scope: string): KeyTable;
  /** Seals and opens the operation references of every shard's keys. */
  readonly refs?: OperationRefCodec | undefined;
}

/**
 * The store a phases runner works on: the store HTTP adapters hand to the engine (`AtomicStore`), whose
 * keys table(s) the runner writes. `PostgresStore` and `ShardedStore` both are.
 */
export type PhaseStore = AtomicStore<Tx> & (KeyTable | ShardedKeyTables);

function isSharded(store: KeyTable | ShardedKeyTables): store is ShardedKeyTables {
  return typeof (store as ShardedKeyTables).shardOf === "function";
}

/** The keys table of a scope. */
export function tableFor(store: KeyTable | ShardedKeyTables, scope: string): KeyTable {
  return isSharded(store) ? store.shardOf(scope) : store;
}

/** Every keys table of a store (the completer, reviews and gauges scan them all). */
export function tablesOf(store: KeyTable | ShardedKeyTables): KeyTable[] {
  return isSharded(store) ? Object.values(store.shards) : [store];
}

/**
 * Run `fn`; when it hits a bucket with no partition yet, create the partitions around now and retry once
 * (`PartitionMissingError`, a 503, for a role that may not create them: `idem sweep` makes them ahead).
 */
export async function withPartitions<T>(table: KeyTable, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    // 23514 "no partition of relation ... found for row": the database's now moved past the partitions
    // made so far (no sweep ran lately).
    if (!isMissingPartition(err)) throw err;
    await table.ensurePartitions();
    return fn();
  }
}

/**
 * @internal The live row of ($1 scope, $2 key) (live.ts), the newest bucket first, as a FROM clause: for readers
 * (inspection, the operation lookup, the console).
 */
export function liveKeyRow(table: Pick<KeyTable, "schema" | "dbTime">): string {
  return `FROM ${table.schema}.keys
      WHERE ${liveRow(table.dbTime, "$1", "$2")}
      ORDER BY bucket DESC LIMIT 1`;
}

/** @internal The live row of (`scope`, `key`) in one keys table, its `columns` (SQL), or undefined when none. */
export async function readLiveKey<R>(
  table: Pick<KeyTable, "db" | "schema" | "dbTime">,
  columns: string,
  scope: string,
  key: string,
): Promise<R | undefined> {
  const { rows } = await table.db.query<R>(`SELECT ${columns} ${liveKeyRow(table)}`, [scope, key]);
  return rows[0];
}
