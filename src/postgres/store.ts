import {
  type AtomicOutcome,
  type AtomicStore,
  type Claim,
  KeyInFlightError,
  KeyMismatchError,
  type StoredResponse,
  TransactionTooLongError,
  type WorkResult,
} from "../core/index.ts";
import type { Db, Tx } from "./db.ts";
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
   * 409 with `Retry-After` (atomic mode). This also bounds lock waits inside the work's transaction.
   * Default: 5,000 ms.
   */
  lockTimeoutMs?: number;
  /**
   * Claims made during the first `boundaryOverlapMs` of a partition also mark the previous partition,
   * so that duplicates racing across a partition boundary meet on one unique index; an atomic
   * transaction that runs longer than half of it is rolled back (TransactionTooLongError, retryable).
   * Default: 600,000 ms (10 minutes). 0 turns markers off (only for a table that is never partitioned
   * across live traffic; a test shows the double execution it allows).
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
}

const RECOVERY_DONE = "done";

/** Thrown inside a transaction to roll it back and carry a result out. */
class Rollback {
  constructor(
    readonly reason: "conflict" | "unsaved" | "gone",
    readonly response?: StoredResponse,
  ) {}
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function sqlState(err: unknown): string | undefined {
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

  /**
   * Retention: drop the partitions whose keys are all past the window. Returns the dropped buckets.
   * Run it periodically (`idem sweep`); it also creates the partitions ahead.
   */
  async sweep(): Promise<{ dropped: number[] }> {
    await this.ensurePartitions();
    return { dropped: await this.partitions.dropExpired(this.clock(), this.retentionMs) };
  }

  /** The live (unexpired) row of a key, or undefined. */
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

  /** Decide what a finished or foreign row means for this claim (replay or 422), or undefined for none. */
  private answerFromRow(claim: Claim, row: KeyRow): AtomicOutcome {
    if (!sameBytes(row.fingerprint, claim.fingerprint)) throw new KeyMismatchError();
    if (row.recovery_point !== RECOVERY_DONE || row.status === null) {
      throw new KeyInFlightError(1);
    }
    return {
      kind: "replayed",
      expiresAt: this.expiresAt(row),
      response: { status: row.status, headers: row.headers ?? [], body: row.body ?? new Uint8Array() },
    };
  }

  /*
   * Atomic mode. Timeline of two duplicates A and B:
   *   A: lookup (nothing) -> BEGIN -> INSERT key row (uncommitted, but the unique index holds it)
   *   B: lookup (nothing: A's row is invisible) -> BEGIN -> INSERT same key ... waits on A's index entry
   *   A: work -> save response -> COMMIT
   *   B: INSERT returns no row (conflict) -> ROLLBACK -> lookup again -> replays A's saved response
   * Had A rolled back, B's INSERT would have gone through and B would run the work itself.
   * If A holds the key past lockTimeoutMs, B answers 409 with Retry-After instead of waiting on.
   */
  async atomic(
    claim: Claim,
    work: (tx: Tx) => Promise<WorkResult>,
    options: { signal?: AbortSignal } = {},
  ): Promise<AtomicOutcome> {
    const now = this.clock();
    const existing = await this.lookup(this.db, claim.scope, claim.key, now);
    if (existing) return this.answerFromRow(claim, existing);

    let withMarker = true;
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.claimAndRun(claim, work, this.clock(), withMarker, options.signal);
      } catch (err) {
        if (err instanceof Rollback) {
          if (err.reason === "unsaved" || err.reason === "gone") {
            return { kind: "executed", response: err.response!, saved: false, expiresAt: new Date(now) };
          }
          // Conflict: the key was claimed and committed by someone else while we waited.
          const row = await this.lookup(this.db, claim.scope, claim.key, this.clock());
          if (row) return this.answerFromRow(claim, row);
          // Only an expired row from before the window stood in the way of our boundary marker.
          if (attempt < 2) {
            withMarker = false;
            continue;
          }
          throw new KeyInFlightError(1);
        }
        if (sqlState(err) === "23514" && attempt < 2 && /no partition/.test(String((err as Error).message))) {
          const b = this.partitions.bucketOf(this.clock());
          await this.partitions.ensure([b - 1, b, b + 1]);
          continue;
        }
        throw err;
      }
    }
  }

  private claimAndRun(
    claim: Claim,
    work: (tx: Tx) => Promise<WorkResult>,
    now: number,
    withMarker: boolean,
    signal: AbortSignal | undefined,
  ): Promise<AtomicOutcome> {
    const bucket = this.partitions.bucketOf(now);
    const marker = withMarker && now - this.partitions.startOf(bucket) < this.boundaryOverlapMs;
    const createdAt = new Date(now).toISOString();
    return this.db.transaction(
      async (tx) => {
        let claimed: number;
        try {
          const params = [bucket, claim.scope, claim.key, claim.fingerprint, createdAt];
          const r = marker
            ? await tx.query(this.sql.claimWithMarker, [...params, bucket - 1])
            : await tx.query(this.sql.claim, params);
          claimed = r.rows.length;
        } catch (err) {
          if (sqlState(err) === "55P03") throw new KeyInFlightError(1); // lock_timeout on the claim
          throw err;
        }
        if (claimed !== (marker ? 2 : 1)) throw new Rollback("conflict");

        const result = await work(tx);
        if (!result.save) throw new Rollback("unsaved", result.response);
        if (signal?.aborted) throw new Rollback("gone", result.response);
        const saved = result.save;
        // Half the overlap bounds the transaction (markers off, overlap 0: no bound, and no boundary safety).
        const bound = Math.floor(this.boundaryOverlapMs / 2);
        const u = await tx.query(this.sql.save, [
          claim.scope,
          claim.key,
          bucket,
          saved.status,
          JSON.stringify(saved.headers),
          saved.body,
          new Date(this.clock()).toISOString(),
          bound,
        ]);
        if (u.rowCount !== 1) throw new TransactionTooLongError(bound);
        return {
          kind: "executed",
          response: result.response,
          saved: true,
          expiresAt: new Date(now + this.retentionMs),
        };
      },
      { begin: `SET LOCAL lock_timeout = '${Math.max(1, Math.floor(this.lockTimeoutMs))}ms'` },
    );
  }
}

function statements(s: string) {
  return {
    lookup: `SELECT bucket, fingerprint, created_at, recovery_point, status, headers, body
               FROM ${s}.keys
              WHERE scope = $1 AND key = $2 AND NOT marker AND bucket >= $3 AND created_at > $4::timestamptz
              ORDER BY bucket DESC LIMIT 1`,
    claim: `INSERT INTO ${s}.keys (bucket, scope, key, fingerprint, created_at)
            VALUES ($1, $2, $3, $4, $5::timestamptz)
            ON CONFLICT DO NOTHING RETURNING marker`,
    claimWithMarker: `INSERT INTO ${s}.keys (bucket, scope, key, fingerprint, created_at, marker)
            VALUES ($1, $2, $3, $4, $5::timestamptz, false), ($6, $2, $3, $4, $5::timestamptz, true)
            ON CONFLICT DO NOTHING RETURNING marker`,
    save: `UPDATE ${s}.keys
              SET recovery_point = 'done', status = $4, headers = $5::text::jsonb, body = $6
            WHERE scope = $1 AND key = $2 AND bucket = $3 AND NOT marker
              AND ($8 <= 0 OR $7::timestamptz < created_at + $8 * interval '1 millisecond')`,
  };
}
