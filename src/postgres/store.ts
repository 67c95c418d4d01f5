/**
 * The PostgreSQL store: its options, opening it (schema and partition checks), retention and sealing-key
 * promotion. Atomic mode runs in ./atomic/, single-statement mode in ./statement/, phases mode in
 * ./phases/; everything about a request meeting its key (the key row, the live-row clause, the lock,
 * the database's clock and the duplicate's gate) lives in ./keys/.
 */
import {
  type AtomicOutcome,
  type AtomicRunOptions,
  type AtomicStore,
  type Claim,
  isKeyedSealer,
  type KeyInspection,
  type OperationRefs,
  type Sealer,
  SqlState,
  sqlStateOf,
  type WorkResult,
  withGuardedTx,
} from "../core/index.ts";
import { AtomicRunner } from "./atomic/runner.ts";
import { type AtomicSql, atomicSql } from "./atomic/sql.ts";
import type { Db, Tx } from "./db.ts";
import { KeyClock } from "./keys/clock.ts";
import type { DbTime, TimeShift } from "./keys/db-time.ts";
import { inspectKey } from "./keys/inspect.ts";
import { type LockPlace, lockSql } from "./keys/lock.ts";
import { placedOnCitus } from "./schema/citus.ts";
import { pendingMigrations, SchemaBehindError, schemaOf } from "./schema/migrate.ts";
import { livePartitions, MAX_LIVE_PARTITIONS, Partitions, PartitionWidthError } from "./schema/partitions.ts";
import { dbRefKey, storeRefs } from "./secrets/ref-keys.ts";
import { PromotedSealer, promoteSealingKey, SealingKeyPromotionError } from "./secrets/sealing-keys.ts";

export { keyLockId } from "./keys/lock.ts";

/** Options of a `PostgresStore`: its schema, retention, waits, clock shift (tests) and sealer. */
export interface PostgresStoreOptions {
  /** The schema idem's tables live in (as given to `migrate`). Default: `"idem"`. */
  schema?: string;
  /**
   * How long a key is remembered, in milliseconds. A retry inside the window never runs twice; after it
   * the same key is new again. Must outlast every retry your clients make. Default: 24 hours.
   */
  retentionMs?: number;
  /**
   * How long a concurrent duplicate waits for the first request to finish before it is answered 409
   * with `Retry-After`. A duplicate in the same process waits in memory; one in another process polls
   * the key's lock with short sleeps. Neither holds a pooled connection while it waits.
   * Default: 5,000 ms.
   */
  lockTimeoutMs?: number;
  /**
   * Phases-mode claims made during the first `boundaryOverlapMs` of a partition also mark the previous
   * partition, so that two first claims racing across a partition boundary meet on one unique index.
   * Default: 600,000 ms (10 minutes). (Atomic mode serialises on a per-key lock instead.)
   */
  boundaryOverlapMs?: number;
  /**
   * Moves the time the store's statements read: every expiry, lease and partition decision compares
   * against the database's `now()` plus `offsetMs` (never the process's clock). For tests, to expire
   * leases and keys without waiting: keep the object and change `offsetMs`; stores given the same
   * object move together. Default: none (the database's own clock).
   */
  timeShift?: TimeShift;
  /**
   * Encrypts saved reply bodies and phases-mode stored inputs at rest (e.g. `sealerFromEnv()`: AES-256-GCM
   * under `IDEM_ENCRYPTION_KEYS`). Values stored in clear before it was set are still read. Default: none
   * (stored in clear; a sealed value then fails to open rather than being replayed as ciphertext).
   * A keyed sealer (`AesGcmSealer`) seals with the key the database records as promoted, not merely
   * its first (`promoteSealingKey`, sealing-keys.ts).
   */
  sealer?: Sealer | undefined;
}

/**
 * The PostgreSQL store: keys, saved responses and the atomic runner (./atomic/runner.ts).
 *
 * Create it with `await PostgresStore.open(db, options)` after `migrate(db)`.
 */
export class PostgresStore implements AtomicStore<Tx> {
  /** The database the keys live in. */
  readonly db: Db;
  /** The schema idem's tables live in (default `idem`). */
  readonly schema: string;
  /** How long a key is kept, in milliseconds. */
  readonly retentionMs: number;
  /** How long a duplicate waits for the key's holder before it is answered 409, in milliseconds. */
  readonly lockTimeoutMs: number;
  /** Claims made this soon after a partition starts also mark the previous partition, in ms. */
  readonly boundaryOverlapMs: number;
  /** What seals saved replies and stored inputs; undefined: stored in clear. */
  readonly sealer: Sealer | undefined;
  /** Seals the operation references clients are given (ref-keys.ts): opaque, unforgeable. */
  readonly refs: OperationRefs;
  /** @internal The keys table's partitions by time (their width and the bucket of an instant). */
  readonly partitions: Partitions;
  /** The database's clock as this store reads it, and the partitions of now (keys/clock.ts). */
  private readonly clock: KeyClock;
  /** Atomic mode's statements, and the time they were built for. */
  private statements: AtomicSql;
  private builtFor: DbTime;
  private readonly runner: AtomicRunner;
  /** Where the per-key lock is taken (keys/lock.ts). */
  private readonly lockPlace: LockPlace;
  /** On Citus (citus.ts): the per-key lock is taken on the key's shard. */
  private onCitus = false;
  /** @internal Whether the keys table is distributed with Citus (found when the store opened; citus.ts). */
  get distributed(): boolean {
    return this.onCitus;
  }

  private constructor(
    db: Db,
    options: PostgresStoreOptions,
    partitionMs: number,
    sealer: Sealer | undefined,
    refs: OperationRefs,
  ) {
    this.db = db;
    this.schema = schemaOf(options);
    this.retentionMs = options.retentionMs ?? DEFAULT_RETENTION_MS;
    this.lockTimeoutMs = options.lockTimeoutMs ?? 5_000;
    this.boundaryOverlapMs = Math.min(options.boundaryOverlapMs ?? 600_000, partitionMs);
    this.sealer = sealer;
    this.refs = refs;
    this.partitions = new Partitions(db, this.schema, partitionMs);
    const clock = new KeyClock(db, options.timeShift ?? { offsetMs: 0 }, this.partitions, this.retentionMs);
    this.clock = clock;
    this.builtFor = clock.dbTime;
    this.statements = atomicSql(this.schema, this.builtFor);
    const store = this;
    this.lockPlace = {
      schema: this.schema,
      lockTimeoutMs: this.lockTimeoutMs,
      get distributed() {
        return store.onCitus;
      },
      get supportsBeginParams() {
        return db.supportsBeginParams;
      },
    };
    this.runner = new AtomicRunner({
      db,
      retentionMs: this.retentionMs,
      lockTimeoutMs: this.lockTimeoutMs,
      sealer,
      refs,
      get sql() {
        return store.sql;
      },
      lockSql: (scope, key) => this.lockSql(scope, key),
      estimatedNowMs: () => clock.estimatedNowMs(),
      ensureCurrentPartitions: () => clock.ensureCurrentPartitions(),
      remakePartitions: () => clock.remakePartitions(),
    });
  }

  /** @internal The time the store's statements read: the database's `now()`, moved by the time shift. */
  get dbTime(): DbTime {
    const t = this.clock.dbTime;
    if (t !== this.builtFor) {
      this.builtFor = t;
      this.statements = atomicSql(this.schema, t);
    }
    return t;
  }

  private get sql(): AtomicSql {
    void this.dbTime; // rebuilds the statements when the shift moved
    return this.statements;
  }

  /**
   * @internal This process's estimate of the database's time (moved by the shift), in epoch ms: a hint,
   * never a decision (which partitions a statement names, when to make partitions ahead).
   */
  estimatedNowMs(): number {
    return this.clock.estimatedNowMs();
  }
  /** A plain transaction for user code, fenced: it cannot be used once `work` returned (guarded-tx.ts). */
  transaction<T>(work: (tx: Tx) => Promise<T>): Promise<T> {
    return this.db.transaction((tx) => withGuardedTx(tx, work));
  }

  /**
   * Read the partition width chosen at migration, check that the schema is current (`SchemaBehindError`
   * otherwise: run `idem migrate`), and that the partitions of now exist. Runs no DDL when they do; a
   * role that may not create them gets `PartitionMissingError` when they do not (run `idem sweep`).
   */
  static async open(db: Db, options: PostgresStoreOptions = {}): Promise<PostgresStore> {
    const schema = schemaOf(options);
    let seconds: number;
    let settings: Record<string, unknown> = {};
    try {
      const { rows } = await db.query<Record<string, unknown>>(`SELECT * FROM ${schema}.settings`);
      settings = rows[0] ?? {};
      seconds = Number(settings.partition_seconds);
    } catch (err) {
      if (sqlStateOf(err) === SqlState.UndefinedTable) {
        throw new SchemaBehindError(schema, ["all"], err);
      }
      if (sqlStateOf(err) === SqlState.InsufficientPrivilege) {
        throw new Error(
          `this database role may not use idem's tables in schema "${schema}": ` +
            `run \`idem migrate --runtime-role <this role>\` as their owner`,
          { cause: err },
        );
      }
      throw err;
    }
    const pending = await pendingMigrations(db, { schema });
    if (pending.length) throw new SchemaBehindError(schema, pending);
    const retentionMs = options.retentionMs ?? DEFAULT_RETENTION_MS;
    if (!(retentionMs > 0))
      throw new RangeError(`retentionMs must be a positive number of ms, got ${retentionMs}`);
    if (livePartitions(retentionMs, seconds * 1000) > MAX_LIVE_PARTITIONS) {
      throw new PartitionWidthError(retentionMs, seconds);
    }
    // A keyed sealer seals with the key the database records as promoted (sealing-keys.ts).
    let sealer = options.sealer;
    if (isKeyedSealer(sealer)) {
      const promoted = new PromotedSealer(db, schema, sealer);
      await promoted.refresh();
      sealer = promoted;
    }
    const refKey = dbRefKey(settings);
    if (!refKey) throw new SchemaBehindError(schema, ["0017_operation_ref_key.sql"]);
    const store = new PostgresStore(db, options, seconds * 1000, sealer, storeRefs(refKey, sealer));
    store.onCitus = await placedOnCitus(db, schema);
    await store.ensurePartitions(true);
    return store;
  }

  /**
   * Make sure of the partitions for the previous width, now and `PARTITIONS_AHEAD` ahead: a catalog
   * read when `idem sweep` made them; otherwise they are created, which needs the CREATE privilege
   * (`PartitionMissingError` without it, for those needed now; with `all`, those ahead too).
   */
  ensurePartitions(all = false): Promise<void> {
    return this.clock.ensurePartitions(all);
  }

  /**
   * Seal new values with `keyId` on every instance sharing this database, once every running instance
   * opens it (else `SealingKeyPromotionError` naming those that do not): step 2 of a key rotation.
   */
  async promoteSealingKey(keyId: string): Promise<{ previous: string | undefined }> {
    if (!(this.sealer instanceof PromotedSealer) || !this.sealer.inner.ids.includes(keyId)) {
      throw new SealingKeyPromotionError(
        `cannot promote sealing key "${keyId}": this store's sealer does not have it (add it to IDEM_ENCRYPTION_KEYS)`,
      );
    }
    const result = await promoteSealingKey(this.db, this.schema, keyId);
    await this.sealer.refresh();
    return result;
  }

  /** At shutdown: this instance no longer holds back a key promotion (it stops being a reader). */
  async retire(): Promise<void> {
    if (this.sealer instanceof PromotedSealer) await this.sealer.retire();
  }

  /** One key as an operator sees it (`KeyInspection`), or undefined when it is not live. */
  inspect(scope: string, key: string): Promise<KeyInspection | undefined> {
    return inspectKey(this, scope, key);
  }

  /**
   * Retention: drop the partitions whose keys are all past the window, and make those ahead
   * (`partitionsAhead`: two days with daily partitions). Returns the dropped buckets. Run it
   * periodically (`idem sweep`, hourly) as the schema's owner: it runs DDL.
   */
  async sweep(): Promise<{ dropped: number[] }> {
    // Past retention by the database's clock, read before the drops: never later than the real now.
    const now = await this.clock.dbNowMs();
    this.clock.madeThrough(await this.partitions.makeAhead(now, this.retentionMs));
    return { dropped: await this.partitions.dropExpired(now, this.retentionMs) };
  }

  /** Run `work` in the transaction that claims the key (atomic mode: ./atomic/runner.ts). */
  atomic(
    claim: Claim,
    work: (tx: Tx) => Promise<WorkResult>,
    options?: AtomicRunOptions<Tx>,
  ): Promise<AtomicOutcome> {
    return this.runner.atomic(claim, work, options);
  }

  /** @internal What serialises every request for one (scope, key), sent with BEGIN (keys/lock.ts). */
  lockSql(scope: string, key: string): string | { sql: string; params: readonly unknown[] } {
    return lockSql(this.lockPlace, scope, key);
  }
}

const DEFAULT_RETENTION_MS = 24 * 3_600_000;
