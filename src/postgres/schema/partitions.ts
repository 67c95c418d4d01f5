import { RetryableError, SqlState, sqlStateOf } from "../../core/index.ts";
import { traced } from "../../core/observe.ts";
import type { Db } from "../db.ts";
import { detachOnCitus, isUnsupportedOnCitus } from "./citus.ts";

/**
 * The most partitions a key lookup may touch. A lookup reads every partition that can hold a live key
 * (a miss probes each one's index, and a generic plan locks each one), so its cost grows with
 * `retention / width`, steeply with many narrow partitions; wider partitions keep it flat
 * (docs/decisions/lookup-partition-bounds.md).
 */
export const MAX_LIVE_PARTITIONS = 12;
/** Partitions created ahead of the current one (an instance whose clock runs ahead finds its own). */
export const PARTITIONS_AHEAD = 1;

/**
 * How far ahead `idem sweep` (and `idem migrate`) make partitions, so that the running service, whose
 * role may not create tables, finds them made: two days, so that a sweep that stops (a failed cron job,
 * a weekend) is noticed long before a request finds no partition.
 */
export const SWEEP_AHEAD_MS = 48 * 3_600_000;

/**
 * The partitions `idem sweep` makes past the current one: enough for `SWEEP_AHEAD_MS`, at least two,
 * and for the keys (`retentionMs` given) no more than keep a lookup within `MAX_LIVE_PARTITIONS` (every
 * lookup probes the empty partitions ahead too): with daily partitions and 24 h of retention, 2 (two to
 * three days); with the narrowest width a retention allows, 1.
 */
export function partitionsAhead(widthMs: number, retentionMs?: number): number {
  const wanted = Math.max(2, Math.ceil(SWEEP_AHEAD_MS / widthMs));
  const room =
    retentionMs === undefined
      ? MAX_LIVE_PARTITIONS
      : MAX_LIVE_PARTITIONS - Math.ceil(retentionMs / widthMs) - 1;
  return Math.max(PARTITIONS_AHEAD, Math.min(wanted, room));
}

/**
 * A partition that a request needs does not exist, and this database role may not create it (the
 * running service has DML rights only: the schema's owner makes partitions ahead with `idem sweep`).
 * Nothing was done: answered 503 with Retry-After; the request may be retried with the same key.
 */
export class PartitionMissingError extends RetryableError {
  /** Always `"PartitionMissingError"`: the name logs and stack traces show. */
  override name = "PartitionMissingError";
  constructor(
    /** The partitioned table. */
    readonly table: string,
    /** The buckets whose partitions are missing. */
    readonly buckets: number[],
    cause: unknown,
  ) {
    super(
      `No partition of ${table} for now, and this database role may not create one; nothing was done. ` +
        "Retry with the same key (operators: run `idem sweep` as the schema's owner, hourly).",
      { cause, retryAfterSeconds: 5 },
    );
  }
}

/** How many partitions a lookup touches with this retention and width: the window's, plus those ahead. */
export function livePartitions(retentionMs: number, widthMs: number): number {
  return Math.ceil(retentionMs / widthMs) + 1 + PARTITIONS_AHEAD;
}

/** The narrowest partition width (whole seconds, at least 60) that keeps a lookup within the bound. */
export function minPartitionSeconds(retentionMs: number): number {
  return Math.max(60, Math.ceil(retentionMs / 1000 / (MAX_LIVE_PARTITIONS - 1 - PARTITIONS_AHEAD)));
}

/** The retention would spread a key's possible places over too many partitions of the migrated width. */
export class PartitionWidthError extends Error {
  /** Always `"PartitionWidthError"`: the name logs and stack traces show. */
  override name = "PartitionWidthError";
  /** Always `"IDEM_PARTITION_WIDTH"`: a code to check that does not depend on the class. */
  readonly code = "IDEM_PARTITION_WIDTH";
  constructor(
    /** The retention asked for, in milliseconds. */
    readonly retentionMs: number,
    /** The schema's partition width, in seconds. */
    readonly partitionSeconds: number,
  ) {
    const live = livePartitions(retentionMs, partitionSeconds * 1000);
    super(
      `retention of ${retentionMs / 3_600_000} h over partitions of ${partitionSeconds} s makes every key lookup ` +
        `touch ${live} partitions (at most ${MAX_LIVE_PARTITIONS}): shorten retentionMs to ` +
        `${(MAX_LIVE_PARTITIONS - 1 - PARTITIONS_AHEAD) * partitionSeconds * 1000} ms or less, or migrate a new ` +
        `schema with partitionSeconds >= ${minPartitionSeconds(retentionMs)}`,
    );
  }
}

/**
 * Tables partitioned in step with another: partition `b` of each is made and dropped with the table's
 * own partition `b`. A key's history (`key_events`, sql/0014) is placed by its key's bucket, so it goes
 * exactly when the key's retention goes.
 */
const IN_STEP: Readonly<Record<string, readonly string[]>> = { keys: ["key_events"] };

/**
 * Bucket arithmetic and partition upkeep for a table partitioned by `bucket`: keys (and with them their
 * history, `key_events`), or the inbox.
 */
export class Partitions {
  constructor(
    private readonly db: Db,
    private readonly schema: string,
    /** Width of one partition in milliseconds. */
    readonly widthMs: number,
    /** The partitioned table. Default `"keys"`. */
    private readonly table = "keys",
  ) {}

  /** The bucket (partition number) an instant falls in; `atMs` in ms since the epoch. */
  bucketOf(atMs: number): number {
    return Math.floor(atMs / this.widthMs);
  }

  /** Where a bucket starts, in ms since the epoch. */
  startOf(bucket: number): number {
    return bucket * this.widthMs;
  }

  /** The table and those partitioned in step with it (`IN_STEP`). */
  private get family(): string[] {
    return [this.table, ...(IN_STEP[this.table] ?? [])];
  }

  /**
   * Create the partitions for these buckets if they do not exist (several instances may race), and
   * return the buckets attached now. Partitions that exist cost a catalog read, no DDL: a role without
   * CREATE (the running service's) gets by as long as `idem sweep` made them ahead. When one of
   * `needed` (default: all of `buckets`) is missing and cannot be made for lack of privilege:
   * `PartitionMissingError`; others that cannot be made are left for the next sweep.
   *
   * Each is created as a table of its own and then attached: `CREATE TABLE ... PARTITION OF` would take
   * an ACCESS EXCLUSIVE lock on the keys table, wait behind every open transaction that touched it,
   * and queue every new request behind it; ATTACH PARTITION takes a lock that reads and writes of keys
   * do not wait for. A table created by an instance that died before attaching it is attached here.
   */
  async ensure(buckets: Iterable<number>, needed?: Iterable<number>): Promise<Set<number>> {
    // Only the missing ones: ATTACH, even of a partition already attached, first waits for a lock on
    // it that every open transaction reading keys holds.
    const attached = new Set(await this.list());
    const must = new Set(needed ?? buckets);
    const denied: number[] = [];
    let cause: unknown;
    let ranges: Array<[number, number]> | undefined;
    for (const b of new Set(buckets)) {
      if (attached.has(b)) continue;
      // A partition wider than one bucket may hold it: the inbox's first (sql/0005: every bucket before
      // the migration's, named after the last of them). An instance whose clock is behind the one that
      // migrated asks for buckets below it; a partition of its own there would overlap (42P17).
      ranges ??= await this.ranges();
      if (ranges.some(([from, to]) => from <= b && b < to)) {
        attached.add(b);
        continue;
      }
      try {
        await this.create(b);
        attached.add(b);
      } catch (err) {
        if (sqlStateOf(err) !== SqlState.InsufficientPrivilege) throw err;
        cause ??= err;
        if (must.has(b)) denied.push(b);
      }
    }
    if (denied.length) throw new PartitionMissingError(`${this.schema}.${this.table}`, denied, cause);
    return attached;
  }

  private async create(b: number): Promise<void> {
    for (const parent of this.family) await this.createOf(parent, b);
  }

  private async createOf(parent: string, b: number): Promise<void> {
    const table = `${this.schema}.${parent}_b${b}`;
    try {
      await this.db.exec(
        `CREATE TABLE IF NOT EXISTS ${table} (LIKE ${this.schema}.${parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`,
      );
    } catch (err) {
      // Another instance created it at the same moment: IF NOT EXISTS does not cover a concurrent
      // CREATE, which fails on the catalog instead (42P07 duplicate table, 42710 "type already
      // exists", 23505 on pg_type's unique index).
      const code = (err as { code?: string }).code;
      if (
        code !== SqlState.DuplicateTable &&
        code !== SqlState.DuplicateObject &&
        code !== SqlState.UniqueViolation
      )
        throw err;
    }
    try {
      await this.db.exec(
        `ALTER TABLE ${this.schema}.${parent} ATTACH PARTITION ${table} FOR VALUES FROM (${b}) TO (${b + 1})`,
      );
    } catch (err) {
      // 42809: already a partition (attached earlier, or by another instance just now).
      if (sqlStateOf(err) !== SqlState.WrongObjectType) throw err;
    }
  }

  /** Make the partitions from the previous one to `partitionsAhead` past now's (the owner's sweep). */
  async makeAhead(nowMs: number, retentionMs?: number): Promise<number> {
    const b = this.bucketOf(nowMs);
    const last = b + partitionsAhead(this.widthMs, retentionMs);
    const buckets: number[] = [];
    for (let i = b - 1; i <= last; i++) buckets.push(i);
    await this.ensure(buckets);
    return last;
  }

  /**
   * The partitions' tables in the schema (`<table>_b<bucket>`), oldest first: attached partitions, one
   * whose detach was interrupted (`pending`), and detached ones a crash left behind between detach and
   * drop (`attached` false).
   */
  async tables(parent = this.table): Promise<{ bucket: number; attached: boolean; pending: boolean }[]> {
    const { rows } = await this.db.query<{ name: string; attached: boolean; pending: boolean }>(
      `SELECT c.relname AS name, i.inhrelid IS NOT NULL AS attached,
              coalesce(i.inhdetachpending, false) AS pending
         FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
         LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
        WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname ~ ('^' || $2 || '_b-?[0-9]+$')`,
      [this.schema, parent],
    );
    return rows
      .map((r) => ({
        bucket: Number(r.name.slice(parent.length + 2)),
        attached: r.attached,
        pending: r.pending,
      }))
      .sort((a, b) => a.bucket - b.bucket);
  }

  /** The bucket ranges [from, to) the table's attached partitions hold (MINVALUE and MAXVALUE unbounded). */
  private async ranges(): Promise<Array<[number, number]>> {
    const { rows } = await this.db.query<{ bound: string }>(
      `SELECT pg_get_expr(c.relpartbound, c.oid) AS bound
         FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = $1::regclass AND NOT i.inhdetachpending`,
      [`${this.schema}.${this.table}`],
    );
    const end = (v: string) =>
      v === "MINVALUE" ? Number.NEGATIVE_INFINITY : v === "MAXVALUE" ? Number.POSITIVE_INFINITY : Number(v);
    const ranges: Array<[number, number]> = [];
    for (const { bound } of rows) {
      const m = /FROM \((MINVALUE|-?\d+)\) TO \((MAXVALUE|-?\d+)\)/.exec(bound);
      if (m) ranges.push([end(m[1]!), end(m[2]!)]);
    }
    return ranges;
  }

  /** The buckets that have a partition (of the table and of those in step with it), oldest first. */
  async list(): Promise<number[]> {
    const attached = async (parent: string) =>
      (await this.tables(parent)).filter((t) => t.attached && !t.pending).map((t) => t.bucket);
    let buckets = await attached(this.table);
    for (const parent of this.family.slice(1)) {
      const theirs = new Set(await attached(parent));
      buckets = buckets.filter((b) => theirs.has(b));
    }
    return buckets;
  }

  /**
   * Drop every partition whose newest possible key is older than the retention window: bucket `b`
   * holds keys created before `start(b + 1)`, so it goes once `start(b + 1) + retention <= now`.
   * A whole partition goes at once; no row-by-row DELETE, no dead tuples to vacuum.
   *
   * It is detached CONCURRENTLY first: a plain DROP would take an ACCESS EXCLUSIVE lock on the keys
   * table, wait behind every open transaction that touched it, and every new request would queue
   * behind the DROP. Detaching concurrently lets requests go on; the detached table is then dropped
   * without touching the keys table. A detach interrupted midway is finished (FINALIZE) on the next
   * sweep, and a table detached but not dropped is dropped then.
   */
  dropExpired(nowMs: number, retentionMs: number): Promise<number[]> {
    return traced(
      "idem.sweep",
      {},
      () => this.dropExpiredNow(nowMs, retentionMs),
      (dropped) => ({
        "idem.sweep.partitions_dropped": dropped.length,
      }),
    );
  }

  private async dropExpiredNow(nowMs: number, retentionMs: number): Promise<number[]> {
    const dropped: number[] = [];
    // Those in step first: a key's history never outlives its key (and is dropped even if the key's
    // partition went before, e.g. a sweep interrupted between the two).
    for (const parent of this.family.slice(1)) await this.dropOf(parent, nowMs, retentionMs);
    dropped.push(...(await this.dropOf(this.table, nowMs, retentionMs)));
    return dropped;
  }

  private async dropOf(parent: string, nowMs: number, retentionMs: number): Promise<number[]> {
    const dropped: number[] = [];
    for (const t of await this.tables(parent)) {
      if (this.startOf(t.bucket + 1) + retentionMs > nowMs) break;
      const table = `${this.schema}.${parent}_b${t.bucket}`;
      if (t.attached) {
        // Its own statement, outside any transaction block (CONCURRENTLY requires it).
        await this.db
          .exec(
            `ALTER TABLE ${this.schema}.${parent} DETACH PARTITION ${table} ${t.pending ? "FINALIZE" : "CONCURRENTLY"}`,
          )
          .catch(async (err) => {
            // Citus: no CONCURRENTLY on a distributed table (citus.ts).
            if (!isUnsupportedOnCitus(err)) throw err;
            await detachOnCitus(this.db, `${this.schema}.${parent}`, table);
          });
      }
      await this.db.exec(`DROP TABLE IF EXISTS ${table}`);
      dropped.push(t.bucket);
    }
    return dropped;
  }
}
