import { createHash } from "node:crypto";
import {
  type AtomicOutcome,
  type AtomicRunOptions,
  type AtomicStore,
  type Claim,
  encodeOperationRef,
  KeyInFlightError,
  type KeyInspection,
  KeyMismatchError,
  type StoredResponse,
  type WorkResult,
} from "../core/index.ts";
import type { Db, Tx } from "./db.ts";
import { inspectKey } from "./inspect.ts";
import { checkSchemaName } from "./migrate.ts";
import { Partitions } from "./partitions.ts";

export interface PostgresStoreOptions {
  /** The schema idem's tables live in (as given to `migrate`). Default: `"idem"`. */
  schema?: string;
  /**
   * How long a key is remembered, in milliseconds. A retry inside the window never runs twice; after it
   * the same key is new again. Must outlast every retry your clients make. Default: 24 hours.
   */
  retentionMs?: number;
  /**
   * How long a concurrent duplicate waits for the first request's transaction before it is answered
   * 409 with `Retry-After`.
   * Default: 5,000 ms.
   */
  lockTimeoutMs?: number;
  /**
   * Phases-mode claims made during the first `boundaryOverlapMs` of a partition also mark the previous
   * partition, so that two first claims racing across a partition boundary meet on one unique index.
   * Default: 600,000 ms (10 minutes). (Atomic mode serialises on a per-key lock instead.)
   */
  boundaryOverlapMs?: number;
  /** The clock, in epoch milliseconds (tests inject one). Default: `Date.now`. */
  clock?: () => number;
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
  /** Compact storage (atomic-mode lookups only): the created resource's id; `headers` and `body` are NULL. */
  resource_id?: string | null;
}

export const RECOVERY_DONE = "done";

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** The SQLSTATE of a driver error, if it has one. */
export function sqlState(err: unknown): string | undefined {
  return (err as { code?: string })?.code;
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
  readonly clock: () => number;
  readonly partitions: Partitions;
  private readonly sql: ReturnType<typeof statements>;

  private constructor(db: Db, options: PostgresStoreOptions, partitionMs: number) {
    this.db = db;
    this.schema = checkSchemaName(options.schema ?? "idem");
    this.retentionMs = options.retentionMs ?? 24 * 3_600_000;
    this.lockTimeoutMs = options.lockTimeoutMs ?? 5_000;
    this.boundaryOverlapMs = Math.min(options.boundaryOverlapMs ?? 600_000, partitionMs);
    this.clock = options.clock ?? Date.now;
    this.partitions = new Partitions(db, this.schema, partitionMs);
    this.sql = statements(this.schema);
  }

  transaction<T>(work: (tx: Tx) => Promise<T>): Promise<T> {
    return this.db.transaction(work);
  }

  /** Read the partition width chosen at migration, and make sure the current partitions exist. */
  static async open(db: Db, options: PostgresStoreOptions = {}): Promise<PostgresStore> {
    const schema = checkSchemaName(options.schema ?? "idem");
    let seconds: number;
    try {
      const { rows } = await db.query<{ partition_seconds: number }>(
        `SELECT partition_seconds FROM ${schema}.settings`,
      );
      seconds = Number(rows[0]?.partition_seconds);
    } catch (err) {
      if (sqlState(err) === "42P01") {
        throw new Error(
          `idem's tables are missing in schema "${schema}": run migrate(db) or \`idem migrate\` first`,
          {
            cause: err,
          },
        );
      }
      throw err;
    }
    const store = new PostgresStore(db, options, seconds * 1000);
    await store.ensurePartitions();
    return store;
  }

  /** Create the partitions for now and the next two widths (cheap; call it from a periodic job too). */
  async ensurePartitions(): Promise<void> {
    const b = this.partitions.bucketOf(this.clock());
    await this.partitions.ensure([b - 1, b, b + 1, b + 2]);
  }

  /** One key as an operator sees it (`KeyInspection`), or undefined when it is not live. */
  inspect(scope: string, key: string): Promise<KeyInspection | undefined> {
    return inspectKey(this, scope, key);
  }

  /**
   * Retention: drop the partitions whose keys are all past the window. Returns the dropped buckets.
   * Run it periodically (`idem sweep`); it also creates the partitions ahead.
   */
  async sweep(): Promise<{ dropped: number[] }> {
    await this.ensurePartitions();
    return { dropped: await this.partitions.dropExpired(this.clock(), this.retentionMs) };
  }

  /** The live (unexpired) row of a key, or undefined (what a replay needs). */
  async lookup(
    q: { query: Db["query"] },
    scope: string,
    key: string,
    nowMs: number,
  ): Promise<KeyRow | undefined> {
    const oldest = nowMs - this.retentionMs;
    const { rows } = await q.query<KeyRow>(this.sql.lookup, [
      scope,
      key,
      this.partitions.bucketOf(oldest),
      new Date(oldest).toISOString(),
    ]);
    return rows[0];
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
      response: { status: row.status, headers: row.headers ?? [], body: row.body ?? new Uint8Array() },
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
   * waited for at most `lockTimeoutMs`. Sent with BEGIN (a literal, no parameters) so that it costs no
   * round trip of its own; the lock timeout is reset afterwards so it does not bound the work.
   */
  lockSql(scope: string, key: string): string {
    return (
      `SET LOCAL lock_timeout = '${Math.max(1, Math.floor(this.lockTimeoutMs))}ms'; ` +
      `SELECT pg_advisory_xact_lock(${keyLockId(scope, key)}); SET LOCAL lock_timeout TO DEFAULT`
    );
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
  async atomic(
    claim: Claim,
    work: (tx: Tx) => Promise<WorkResult>,
    options: AtomicRunOptions<Tx> = {},
  ): Promise<AtomicOutcome> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.runAtomic(claim, work, options);
      } catch (err) {
        if (err instanceof Rollback) {
          return {
            kind: "executed",
            response: err.response,
            saved: false,
            expiresAt: new Date(this.clock()),
          };
        }
        if (sqlState(err) === "55P03" && !(err instanceof WorkError)) throw new KeyInFlightError(1);
        if (err instanceof WorkError) throw err.cause;
        if (sqlState(err) === "23514" && attempt < 2 && /no partition/.test(String((err as Error).message))) {
          const b = this.partitions.bucketOf(this.clock());
          await this.partitions.ensure([b, b + 1]);
          continue;
        }
        throw err;
      }
    }
  }

  private runAtomic(
    claim: Claim,
    work: (tx: Tx) => Promise<WorkResult>,
    { signal, rebuild }: AtomicRunOptions<Tx>,
  ): Promise<AtomicOutcome> {
    return this.db.transaction(
      async (tx) => {
        const now = this.clock();
        const existing = await this.lookup(tx, claim.scope, claim.key, now);
        if (existing) return this.answerFromRow(claim, existing, tx, rebuild);

        let result: WorkResult;
        try {
          result = await work(tx);
        } catch (err) {
          throw new WorkError(err);
        }
        if (!result.save) throw new Rollback(result.response);
        if (signal?.aborted) throw new Rollback(result.response); // the client hung up: save nothing
        const saved = result.save;
        const compact = result.compactId !== undefined;
        tx.final(this.sql.insertDone, [
          this.partitions.bucketOf(now),
          claim.scope,
          claim.key,
          claim.fingerprint,
          new Date(now).toISOString(),
          saved.status,
          compact ? null : JSON.stringify(saved.headers),
          compact ? null : saved.body,
          compact ? result.compactId : null,
        ]);
        return {
          kind: "executed",
          response: result.response,
          saved: true,
          expiresAt: new Date(now + this.retentionMs),
        };
      },
      { begin: this.lockSql(claim.scope, claim.key) },
    );
  }
}

/** Thrown inside a transaction to roll it back and carry the unsaved response out. */
class Rollback {
  constructor(readonly response: StoredResponse) {}
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
  return createHash("sha256").update(scope).update("\0").update(key).digest().readBigInt64BE(0).toString();
}

function statements(s: string) {
  const lookupWhere = `FROM ${s}.keys
              WHERE scope = $1 AND key = $2 AND NOT marker AND bucket >= $3 AND created_at > $4::timestamptz
              ORDER BY bucket DESC LIMIT 1`;
  return {
    lookup: `SELECT bucket, fingerprint, created_at, recovery_point, status, headers, body, resource_id ${lookupWhere}`,
    insertDone: `INSERT INTO ${s}.keys (bucket, scope, key, fingerprint, created_at, recovery_point, status, headers, body,
                                        resource_id)
                 VALUES ($1, $2, $3, $4, $5::timestamptz, 'done', $6, $7::text::jsonb, $8, $9)`,
  };
}
