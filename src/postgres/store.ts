/**
 * The PostgreSQL store: the atomic runner, its lookup and waits, and retention.
 *
 * Longer than most files here (about 480 lines) on purpose: the atomic path (lookup, in-process and
 * cross-process waits, the per-key lock, the work, the saved reply) is one concurrency argument, told
 * by the timeline comment above `atomic`; split across files it could no longer be checked in one read.
 * Phases mode lives in ./phases/, the partitions in ./partitions.ts, inspection in ./inspect.ts.
 */
import { hash } from "node:crypto";
import {
  AbandonedWorkError,
  type AtomicOutcome,
  type AtomicRunOptions,
  type AtomicStore,
  type Claim,
  isKeyedSealer,
  isMissingPartition,
  KeyInFlightError,
  type KeyInspection,
  KeyMismatchError,
  openReply,
  RetryableError,
  type Sealer,
  SqlState,
  type StoredResponse,
  sealBytes,
  sealContext,
  sealHeaders,
  sqlStateOf,
  type WorkResult,
  withGuardedTx,
} from "../core/index.ts";
import { placedOnCitus, shardLockSql } from "./citus.ts";
import type { Db, Tx } from "./db.ts";
import { DbTime, type TimeShift } from "./db-time.ts";
import { inspectKey } from "./inspect.ts";
import { pendingMigrations, SchemaBehindError, schemaOf } from "./migrate.ts";
import {
  livePartitions,
  MAX_LIVE_PARTITIONS,
  PARTITIONS_AHEAD,
  Partitions,
  PartitionWidthError,
} from "./partitions.ts";
import { PromotedSealer, promoteSealingKey, SealingKeyPromotionError } from "./sealing-keys.ts";

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
  sealer?: Sealer;
}

/** A key row as read back. */
export interface KeyRow {
  bucket: number;
  fingerprint: Uint8Array;
  created_at: Date;
  recovery_point: string;
  status: number | null;
  headers: Array<[string, string]> | null;
  body: Uint8Array | null;
  /** The key row's claim identity (sql/0008; null for rows claimed before it). */
  claim_id?: string | null;
  /** Compact storage (atomic-mode lookups only): the created resource's id; `headers` and `body` are NULL. */
  resource_id?: string | null;
}

export const RECOVERY_DONE = "done";

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * The PostgreSQL store: keys, saved responses and the atomic runner.
 *
 * Create it with `await PostgresStore.open(db, options)` after `migrate(db)`.
 */
export class PostgresStore implements AtomicStore<Tx> {
  readonly db: Db;
  readonly schema: string;
  readonly retentionMs: number;
  readonly lockTimeoutMs: number;
  readonly boundaryOverlapMs: number;
  readonly sealer: Sealer | undefined;
  readonly partitions: Partitions;
  private readonly shift: TimeShift;
  private time: DbTime;
  private statements: ReturnType<typeof statements>;
  /**
   * The database's clock minus this process's, as last measured (`ensurePartitions`): for hints only
   * (when to make partitions ahead, when a finished key may have expired). Every decision is a statement.
   */
  private skewMs = 0;
  /** This process's atomic calls in progress, by (scope, key): a duplicate waits on it, in memory. */
  private readonly inFlight = new Map<string, Promise<void>>();
  /**
   * Keys this process saw finished (saved or replayed), with when they expire: a retry of one is read
   * first without a lock or a transaction, one statement (a finished key never changes). A hint only:
   * a key swept, expired or unknown here takes the locked path. Bounded; the oldest go first.
   */
  private readonly finished = new Map<string, number>();
  /** The last bucket this store made sure exists: a request past it creates the partitions first. */
  private ensuredThrough = Number.NEGATIVE_INFINITY;
  /** On Citus (citus.ts): the per-key lock is taken on the key's shard. */
  private onCitus = false;

  private constructor(
    db: Db,
    options: PostgresStoreOptions,
    partitionMs: number,
    sealer: Sealer | undefined,
  ) {
    this.db = db;
    this.schema = schemaOf(options);
    this.retentionMs = options.retentionMs ?? DEFAULT_RETENTION_MS;
    this.lockTimeoutMs = options.lockTimeoutMs ?? 5_000;
    this.boundaryOverlapMs = Math.min(options.boundaryOverlapMs ?? 600_000, partitionMs);
    this.shift = options.timeShift ?? { offsetMs: 0 };
    this.sealer = sealer;
    this.partitions = new Partitions(db, this.schema, partitionMs);
    this.time = new DbTime(this.shift.offsetMs, partitionMs, this.retentionMs);
    this.statements = statements(this.schema, this.time);
  }

  /** The time the store's statements read: the database's `now()`, moved by the time shift (db-time.ts). */
  get dbTime(): DbTime {
    if (this.time.offsetMs !== this.shift.offsetMs) {
      this.time = new DbTime(this.shift.offsetMs, this.partitions.widthMs, this.retentionMs);
      this.statements = statements(this.schema, this.time);
    }
    return this.time;
  }

  private get sql(): ReturnType<typeof statements> {
    void this.dbTime; // rebuilds the statements when the shift moved
    return this.statements;
  }

  /** The database's time (moved by the time shift) in epoch ms, read now, and the skew hint with it. */
  private async dbNowMs(): Promise<number> {
    const before = Date.now();
    const { rows } = await this.db.query<{ ms: number }>(
      "SELECT (extract(epoch FROM now()) * 1000)::float8 AS ms",
    );
    const ms = Number(rows[0]!.ms);
    this.skewMs = ms - (before + Date.now()) / 2;
    return ms + this.shift.offsetMs;
  }

  /** This process's estimate of the database's time (moved by the shift): a hint, never a decision. */
  private estimatedNowMs(): number {
    return Date.now() + this.skewMs + this.shift.offsetMs;
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
    try {
      const { rows } = await db.query<{ partition_seconds: number }>(
        `SELECT partition_seconds FROM ${schema}.settings`,
      );
      seconds = Number(rows[0]?.partition_seconds);
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
    const store = new PostgresStore(db, options, seconds * 1000, sealer);
    store.onCitus = await placedOnCitus(db, schema);
    await store.ensurePartitions(true);
    return store;
  }

  /**
   * Make sure of the partitions for the previous width, now and `PARTITIONS_AHEAD` ahead: a catalog
   * read when `idem sweep` made them; otherwise they are created, which needs the CREATE privilege
   * (`PartitionMissingError` without it, for those needed now; with `all`, those ahead too).
   */
  async ensurePartitions(all = false): Promise<void> {
    // Around the database's now: every instance places its keys by that clock (db-time.ts).
    const b = this.partitions.bucketOf(await this.dbNowMs());
    const buckets = [b - 1];
    for (let i = 0; i <= PARTITIONS_AHEAD; i++) buckets.push(b + i);
    const attached = await this.partitions.ensure(buckets, all ? buckets : [b - 1, b]);
    // Made ahead by a sweep: nothing to check until past the last of them.
    let through = b;
    while (attached.has(through + 1)) through++;
    this.ensuredThrough = Math.max(this.ensuredThrough, through);
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
    const now = await this.dbNowMs();
    const last = await this.partitions.makeAhead(now, this.retentionMs);
    this.ensuredThrough = Math.max(this.ensuredThrough, last);
    return { dropped: await this.partitions.dropExpired(now, this.retentionMs) };
  }

  /**
   * The live (unexpired, by the database's clock) row of a key, or undefined (what a replay needs).
   * It reads only the partitions from the one holding `now - retention` on (pruned by `bucket >=` when
   * the statement starts), at most `MAX_LIVE_PARTITIONS` of them while `sweep()` keeps up.
   */
  async lookup(q: { query: Db["query"] }, scope: string, key: string): Promise<KeyRow | undefined> {
    return (await this.lookupAt(q, scope, key)).row;
  }

  /** The statement `lookup` runs, with its parameters (for benchmarks and EXPLAIN). */
  lookupQuery(scope: string, key: string): { text: string; params: unknown[] } {
    return { text: this.sql.lookup, params: [scope, key] };
  }

  /**
   * The live row of a key, and when a key saved in the statement's transaction expires: the database's
   * now (the transaction's start, which the saved row's created_at will be) plus the retention.
   */
  private async lookupAt(
    q: { query: Db["query"] },
    scope: string,
    key: string,
  ): Promise<{ row: KeyRow | undefined; expiresAt: Date }> {
    const { rows } = await q.query<KeyRow & { new_expires_at: Date }>(this.sql.lookup, [scope, key]);
    const r = rows[0]!;
    return { row: r.bucket === null ? undefined : r, expiresAt: new Date(r.new_expires_at) };
  }

  expiresAt(row: { created_at: Date }): Date {
    return new Date(new Date(row.created_at).getTime() + this.retentionMs);
  }

  /**
   * What an existing row means for this claim: `KeyMismatchError` (422) for another request under the
   * key, the replay of a finished row, or undefined for a row that is not finished yet. The fingerprint
   * is checked first, so a wrong request never gets further (in phases mode: never takes the lease).
   */
  replayOf(claim: Claim, row: KeyRow): AtomicOutcome | undefined {
    if (!sameBytes(row.fingerprint, claim.fingerprint)) throw new KeyMismatchError();
    if (row.recovery_point !== RECOVERY_DONE || row.status === null) return undefined;
    if (row.resource_id != null) throw new CompactWithoutRebuildError();
    return {
      kind: "replayed",
      expiresAt: this.expiresAt(row),
      response: openReply(this.sealer, row, claim.scope, claim.key),
    };
  }

  /**
   * Decide what a finished or foreign row means for this claim (replay or 422), or 409 for an unfinished
   * one. A row saved in compact form is replayed through `rebuild`, in the lookup's transaction.
   */
  private async answerFromRow(
    claim: Claim,
    row: KeyRow,
    tx: Tx,
    rebuild: AtomicRunOptions<Tx>["rebuild"],
  ): Promise<AtomicOutcome> {
    if (row.resource_id != null && row.status !== null && sameBytes(row.fingerprint, claim.fingerprint)) {
      if (!rebuild) throw new CompactWithoutRebuildError();
      let response: StoredResponse;
      try {
        response = await rebuild({ status: row.status, id: row.resource_id }, tx);
      } catch (err) {
        throw new WorkError(err);
      }
      return { kind: "replayed", expiresAt: this.expiresAt(row), response };
    }
    const replay = this.replayOf(claim, row);
    if (!replay) throw new KeyInFlightError(1);
    // A done row never changes: its answer is final, and the transaction has nothing left to do.
    tx.readOnlyDone?.();
    return replay;
  }

  /**
   * The SQL that serialises every request for one (scope, key): a transaction-scoped advisory lock,
   * waited for in the server at most `LOCK_WAIT_MS` (then 55P03, and the caller sleeps without a
   * connection and tries again). Sent with BEGIN (a literal, no parameters) so that it costs no round
   * trip of its own; the lock timeout is reset afterwards so it does not bound the work.
   */
  lockSql(scope: string, key: string): string {
    const wait = Math.max(1, Math.min(LOCK_WAIT_MS, Math.floor(this.lockTimeoutMs)));
    if (this.onCitus) return shardLockSql(this.schema, scope, keyLockId(scope, key), wait);
    return (
      `SET LOCAL lock_timeout = '${wait}ms'; ` +
      `SELECT pg_advisory_xact_lock(${keyLockId(scope, key)}); SET LOCAL lock_timeout TO DEFAULT`
    );
  }

  /**
   * The answer a finished key gives, read without a lock or a transaction (a done row never changes
   * until it expires): its replay, or `KeyMismatchError` for another request. Undefined when there is
   * no live row, or it is not finished, or it is compact (rebuilt inside a transaction).
   */
  private async finishedAnswer(claim: Claim): Promise<AtomicOutcome | undefined> {
    const row = await this.lookup(this.db, claim.scope, claim.key);
    if (!row || row.resource_id != null) return undefined;
    return this.replayOf(claim, row);
  }

  /*
   * Atomic mode. Timeline of two duplicates A and B:
   *   A: BEGIN + lock(scope, key) + lookup (nothing)  -> work -> INSERT key row with response + COMMIT
   *   B: BEGIN + lock(scope, key) ... waits for A's transaction to end
   *   A: COMMIT (the lock goes with it)
   *   B: lookup, a new statement with a new snapshot -> sees A's row -> replays A's saved response
   * Had A rolled back, B's lookup would find nothing and B would run the work itself. If A holds the
   * lock past lockTimeoutMs, B answers 409 with Retry-After instead of waiting on.
   *
   * Why a lock rather than claiming with an early INSERT: the keys table is partitioned by time, and
   * PostgreSQL's unique indexes are per partition, so two duplicates on either side of a partition
   * boundary would not meet on one index. The lock is per key whatever the partition, and the key row
   * is written once, with its response, instead of inserted and then updated. The primary key still
   * backs it up: a duplicate row in one partition fails and rolls the whole transaction back.
   *
   * With a pipelining driver the whole path is three round trips: [BEGIN, lock, lookup], the work,
   * and [INSERT key row, COMMIT].
   */
  /*
   * Waiting duplicates hold no pooled connection (a hundred duplicates of one slow key would otherwise
   * take the whole pool from every other account):
   *   - in this process, a duplicate waits on the in-flight call's promise, in memory;
   *   - across processes, the lock is waited for in the server only briefly (LOCK_WAIT_MS); on 55P03
   *     the transaction ends, the connection goes back, and the duplicate sleeps and tries again.
   * After any wait the duplicate first reads the key without a lock (a finished key replays at once),
   * then takes the locked path. Past `lockTimeoutMs` in all: 409 with Retry-After.
   */
  async atomic(
    claim: Claim,
    work: (tx: Tx) => Promise<WorkResult>,
    options: AtomicRunOptions<Tx> = {},
  ): Promise<AtomicOutcome> {
    const id = `${claim.scope.length}:${claim.scope}${claim.key}`;
    const deadline = Date.now() + this.lockTimeoutMs;
    let waited = false;
    for (;;) {
      const running = this.inFlight.get(id);
      if (!running) break;
      waited = true;
      if (!(await settlesBefore(running, deadline))) throw new KeyInFlightError(RETRY_AFTER_S);
    }
    let finish!: () => void;
    // A speculative work started once lives on across attempts: its handler cannot be run twice.
    const spec: Speculation = {};
    this.inFlight.set(
      id,
      new Promise<void>((r) => {
        finish = r;
      }),
    );
    try {
      // Past the partitions made so far (no sweep ran lately): make them before the work runs, so the
      // key row has somewhere to go (else the request would be answered 503 after its work had run).
      // (A hint from this process's estimate of the database's clock; a partition still missing at the
      // insert is made then, and the request retried.)
      if (this.partitions.bucketOf(this.estimatedNowMs()) > this.ensuredThrough)
        await this.ensurePartitions();
      for (let pause = 5; ; pause = Math.min(pause * 2, 100)) {
        if (waited || this.seenFinished(id)) {
          const answer = await this.finishedAnswer(claim);
          if (answer) {
            this.sawFinished(id, answer.expiresAt);
            return answer;
          }
          this.finished.delete(id);
        }
        try {
          const out = await this.atomicOnce(claim, work, options, spec);
          if (!options.rebuild && (out.kind === "replayed" || out.saved)) this.sawFinished(id, out.expiresAt);
          return out;
        } catch (err) {
          if (!(err instanceof LockBusy)) throw err;
        }
        waited = true;
        const left = deadline - Date.now();
        if (left <= 0) throw new KeyInFlightError(RETRY_AFTER_S);
        await new Promise((r) => setTimeout(r, Math.min(left, pause * (0.5 + Math.random()))));
      }
    } finally {
      if (spec.gate?.abandon()) {
        // Answered otherwise (409, a replay read after a wait, an error) while the work still waited for
        // its key: it has been told, and its adapter's error path ends before the answer is written
        // (bounded: an error handler that never answers must not hold this request).
        await settlesBefore(spec.running ?? Promise.resolve(), Date.now() + ABANDON_WAIT_MS);
      }
      this.inFlight.delete(id);
      finish();
    }
  }

  private seenFinished(id: string): boolean {
    const until = this.finished.get(id);
    if (until === undefined) return false;
    if (until > this.estimatedNowMs()) return true; // a hint: the lookup decides whether it expired
    this.finished.delete(id);
    return false;
  }

  private sawFinished(id: string, expiresAt: Date): void {
    this.finished.delete(id); // re-inserted last: the map's order is the eviction order
    this.finished.set(id, expiresAt.getTime());
    if (this.finished.size > FINISHED_HINTS) this.finished.delete(this.finished.keys().next().value!);
  }

  /** One locked attempt (LockBusy when another transaction holds the key past LOCK_WAIT_MS). */
  private async atomicOnce(
    claim: Claim,
    work: (tx: Tx) => Promise<WorkResult>,
    options: AtomicRunOptions<Tx>,
    spec: Speculation,
  ): Promise<AtomicOutcome> {
    try {
      return await this.runAtomic(claim, work, options, spec);
    } catch (err) {
      if (err instanceof AnswerAfterRollback) return await err.answer;
      if (err instanceof Rollback) {
        return {
          kind: "executed",
          response: err.response,
          saved: false,
          expiresAt: new Date(this.estimatedNowMs()),
        };
      }
      if (sqlStateOf(err) === SqlState.LockNotAvailable && !(err instanceof WorkError)) throw new LockBusy();
      if (err instanceof WorkError) throw err.cause;
      if (isMissingPartition(err)) {
        // The key row's partition went away under this store (a sweep elsewhere with a shorter
        // retention): everything rolled back. The work has run, and an adapter's handler cannot run
        // twice, so the partition is made again (or PartitionMissingError, 503, for a role that may
        // not) and the caller retries: the key is still free.
        this.ensuredThrough = Number.NEGATIVE_INFINITY;
        await this.ensurePartitions();
        throw new RetryableError(
          "the key's partition was missing; it has been made again, retry the request",
          {
            cause: err,
          },
        );
      }
      throw err;
    }
  }

  private runAtomic(
    claim: Claim,
    work: (tx: Tx) => Promise<WorkResult>,
    { signal, rebuild, speculate }: AtomicRunOptions<Tx>,
    spec: Speculation,
  ): Promise<AtomicOutcome> {
    return this.db.transaction(
      async (tx) => {
        let result: WorkResult;
        let expiresAt: Date;
        if (speculate && tx.pipelined && !rebuild) {
          // The work starts now, and its first statement leaves with BEGIN, the lock and the lookup, in
          // one write. The lookup answers first (statements answer in order), and the work sees its own
          // statement's answer only once the lookup said the key is free.
          //
          // When the key's lock was busy (55P03, the key in flight elsewhere), this transaction was
          // aborted before anything of the work ran; the work is not told, and its waiting statements
          // are sent again in the next attempt's transaction (an adapter cannot run its handler twice).
          const lookup = this.lookupAt(tx, claim.scope, claim.key);
          let gate = spec.gate;
          let running = spec.running;
          if (gate?.waiting && running) gate.retryOn(tx);
          else {
            gate = spec.gate = new SpeculativeTx(tx);
            // Fenced: what the work keeps past its return fails at once (guarded-tx.ts).
            running = spec.running = withGuardedTx(gate, work).then(
              (r) => r,
              (err) => {
                throw new WorkError(err);
              },
            );
            running.catch(() => {}); // abandoned below when the key is taken
          }
          let existing: KeyRow | undefined;
          try {
            ({ row: existing, expiresAt } = await lookup); // a lock timeout (55P03) rejects here: LockBusy, retried
          } catch (err) {
            if (sqlStateOf(err) !== SqlState.LockNotAvailable) gate.abandon();
            throw err;
          }
          if (existing) {
            // The key was taken (or finished) meanwhile: roll the work's statements back, then answer.
            gate.abandon();
            throw new AnswerAfterRollback(this.answerFromRow(claim, existing, tx, rebuild));
          }
          gate.free();
          result = await running;
        } else {
          const { row: existing, expiresAt: fresh } = await this.lookupAt(tx, claim.scope, claim.key);
          if (existing) return this.answerFromRow(claim, existing, tx, rebuild);
          expiresAt = fresh;
          try {
            // Fenced: what the work keeps past its return fails at once (guarded-tx.ts).
            result = await withGuardedTx(tx, work);
          } catch (err) {
            throw new WorkError(err);
          }
        }
        if (!result.save) throw new Rollback(result.response);
        if (signal?.aborted) throw new Rollback(result.response); // the client hung up: save nothing
        const saved = result.save;
        const compact = result.compactId !== undefined;
        // Its bucket and created_at are the database's now (this transaction's start, the instant the
        // lookup read), whatever this process's clock says.
        tx.final(this.sql.insertDone, [
          claim.scope,
          claim.key,
          claim.fingerprint,
          saved.status,
          compact ? null : sealHeaders(this.sealer, saved.headers, claim.scope, claim.key),
          compact ? null : sealBytes(this.sealer, saved.body, sealContext(claim.scope, claim.key, "body")),
          compact ? result.compactId : null,
        ]);
        return {
          kind: "executed",
          response: result.response,
          saved: true,
          expiresAt: expiresAt!,
        };
      },
      { begin: this.lockSql(claim.scope, claim.key), batch: speculate === true },
    );
  }
}

const DEFAULT_RETENTION_MS = 24 * 3_600_000;

/** How long an abandoned speculative work may take to end before the key's answer is given anyway. */
const ABANDON_WAIT_MS = 1_000;

/** How many finished keys a store remembers to read without a lock (about 100 bytes each). */
const FINISHED_HINTS = 10_000;

/** How long the server waits for a key's lock before the duplicate lets its connection go and sleeps. */
const LOCK_WAIT_MS = 10;
/** The Retry-After of a 409 for a key still in flight. */
const RETRY_AFTER_S = 1;

/** Another transaction held the key's lock past LOCK_WAIT_MS. */
class LockBusy {}

/** Whether `p` settles (either way) before `deadline` (epoch ms). */
function settlesBefore(p: Promise<unknown>, deadline: number): Promise<boolean> {
  const left = deadline - Date.now();
  if (left <= 0) return Promise.resolve(false);
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    p.then(
      () => true,
      () => true,
    ),
    new Promise<boolean>((r) => {
      timer = setTimeout(() => r(false), left);
    }),
  ]).finally(() => clearTimeout(timer));
}

/** Thrown inside a transaction to roll it back and carry the unsaved response out. */
class Rollback {
  constructor(readonly response: StoredResponse) {}
}

/**
 * Thrown inside a speculative transaction whose key turned out to be taken: the work's statements roll
 * back, and the key's answer (a replay, 409 or 422, settled or not) is given after.
 */
class AnswerAfterRollback {
  constructor(readonly answer: Promise<AtomicOutcome>) {
    answer.catch(() => {});
  }
}

/** The speculative work of one `atomic` call, kept across its locked attempts. */
interface Speculation {
  gate?: SpeculativeTx;
  running?: Promise<WorkResult>;
}

/**
 * The transaction as a speculative work sees it: while the lookup has not answered, its statements are
 * sent at once (pipelined behind the lookup), but their answers reach the work only once the lookup
 * found the key free. Once the key is known taken (or the lookup failed), every statement, pending or
 * new, rejects with `AbandonedWorkError`, and nothing more is sent: the transaction is rolling back,
 * and a statement sent after its ROLLBACK would run on its own. When the key's lock was busy, the
 * waiting statements are sent again in the next attempt's transaction (`retryOn`).
 */
class SpeculativeTx implements Tx {
  private state: "pending" | "free" | "taken" = "pending";
  /** Settles when this attempt is decided (free, taken) or replaced by the next one (`retryOn`). */
  private turn!: Promise<void>;
  private endTurn!: () => void;
  constructor(private tx: Tx) {
    this.newTurn();
  }
  private newTurn(): void {
    this.turn = new Promise<void>((resolve) => {
      this.endTurn = resolve;
    });
  }
  /** Whether the work still waits to learn whether its key is free. */
  get waiting(): boolean {
    return this.state === "pending";
  }
  /** The lookup found the key free: the statements' answers reach the work from now on. */
  free(): void {
    this.state = "free";
    this.endTurn();
  }
  /** The key is taken: the work's statements are abandoned from now on. True if the work was waiting. */
  abandon(): boolean {
    const waiting = this.state === "pending";
    this.state = "taken";
    this.endTurn();
    return waiting;
  }
  /** The key's lock was busy: the waiting statements are sent again in `tx`, the next attempt's. */
  retryOn(tx: Tx): void {
    this.tx = tx;
    const ended = this.endTurn;
    this.newTurn();
    ended();
  }
  get raw(): unknown {
    return this.tx.raw;
  }
  get pipelined(): boolean | undefined {
    return this.tx.pipelined;
  }
  private async gate<T>(send: (tx: Tx) => Promise<T>): Promise<T> {
    for (;;) {
      if (this.state === "free") return send(this.tx);
      if (this.state === "taken") throw new AbandonedWorkError();
      const turn = this.turn;
      const sent = send(this.tx);
      sent.catch(() => {});
      await turn;
      if (this.turn !== turn) continue; // sent in an aborted transaction: send it again (or be told)
      if ((this.state as SpeculativeTx["state"]) === "free") return sent; // changed meanwhile
      throw new AbandonedWorkError();
    }
  }
  query<R>(sql: string, params?: readonly unknown[]) {
    return this.gate((tx) => tx.query<R>(sql, params));
  }
  exec(sql: string): Promise<void> {
    return this.gate((tx) => tx.exec(sql));
  }
  final(sql: string, params?: readonly unknown[]): void {
    this.tx.final(sql, params);
  }
}

/** A key saved in compact form was looked up by a route that cannot rebuild its reply. */
export class CompactWithoutRebuildError extends Error {
  override name = "CompactWithoutRebuildError";
  constructor() {
    super(
      "this key was saved in compact form (status and resource id): replay it through a route with `compact.rebuild`",
    );
  }
}

/** Wraps what the work threw, so that the work's own errors are never mistaken for ours. */
class WorkError {
  constructor(readonly cause: unknown) {}
}

/** A signed 64-bit lock id for (scope, key): the first 8 bytes of SHA-256, as a decimal literal. */
export function keyLockId(scope: string, key: string): string {
  // crypto.hash: one call and no Hash object per request; the same bytes as before (UTF-8 of the three).
  return hash("sha256", `${scope}\0${key}`, "buffer").readBigInt64BE(0).toString();
}

/** The atomic runner's statements, with the store's time (db-time.ts): every expiry is the database's. */
function statements(s: string, t: DbTime) {
  const lookupWhere = `FROM ${s}.keys
              WHERE scope = $1 AND key = $2 AND NOT marker AND bucket >= ${t.oldestBucket} AND created_at > ${t.oldest}
              ORDER BY bucket DESC LIMIT 1`;
  return {
    // Always one row: the key's live row (or NULLs), and when a key saved in this transaction expires.
    lookup: `SELECT k.*, ${t.now} + interval '${Math.trunc(t.retentionMs)} milliseconds' AS new_expires_at
               FROM (VALUES (1)) AS one (x) LEFT JOIN LATERAL (
                 SELECT bucket, fingerprint, created_at, recovery_point, status, headers, body, resource_id,
                        claim_id::text AS claim_id ${lookupWhere}
               ) k ON true`,
    // The key row with its reply. A row of the same (scope, key) in this bucket that has expired (the
    // retention is shorter than a partition, so it is still there) is replaced in place, every column
    // reset; a live one is never touched: the second INSERT then runs and fails on the primary key
    // (23505), which rolls the transaction back as a duplicate row always did.
    insertDone: `WITH put AS (
              INSERT INTO ${s}.keys (bucket, scope, key, fingerprint, created_at, recovery_point, status, headers,
                                     body, resource_id)
              VALUES (${t.bucket}, $1, $2, $3, ${t.now}, 'done', $4, $5::text::jsonb, $6, $7)
              ON CONFLICT (scope, key, bucket) DO UPDATE
                 SET marker = false, fingerprint = EXCLUDED.fingerprint, created_at = EXCLUDED.created_at,
                     recovery_point = 'done', status = EXCLUDED.status, headers = EXCLUDED.headers,
                     body = EXCLUDED.body, resource_id = EXCLUDED.resource_id, lease_token = NULL,
                     lease_until = NULL, runner = NULL, request = NULL, phase_data = NULL, updated_at = NULL,
                     attempted_at = NULL, lookup_failures = 0, needs_review_at = NULL,
                     claim_id = EXCLUDED.claim_id
               WHERE ${t.expiredAgainst(`${s}.keys.created_at`, "EXCLUDED.created_at")}
              RETURNING 1
            )
            INSERT INTO ${s}.keys (bucket, scope, key, fingerprint, created_at)
            SELECT ${t.bucket}, $1, $2, $3, ${t.now} WHERE NOT EXISTS (SELECT 1 FROM put)`,
  };
}
