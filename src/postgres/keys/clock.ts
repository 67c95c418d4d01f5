/**
 * The database's clock as a store of keys reads it: the time its statements read (`DbTime`, the
 * database's `now()` moved by the store's time shift), this process's estimate of it (a hint, never a
 * decision), and the partitions of now made sure of by that clock. Every mode and the key gate
 * (gate.ts) read time from here; none from `Date.now()` alone.
 */
import type { Db } from "../db.ts";
import { PARTITIONS_AHEAD, type Partitions } from "../schema/partitions.ts";
import { DbTime, type TimeShift } from "./db-time.ts";

export class KeyClock {
  private time: DbTime;
  /**
   * The database's clock minus this process's, as last measured (`ensurePartitions`): for hints only
   * (when to make partitions ahead, when a finished key may have expired, how long a duplicate has
   * waited). Every decision is a statement.
   */
  private skewMs = 0;
  /** The last bucket made sure of: a request past it creates the partitions first. */
  private ensuredThrough = Number.NEGATIVE_INFINITY;

  constructor(
    private readonly db: Db,
    private readonly shift: TimeShift,
    readonly partitions: Partitions,
    private readonly retentionMs: number,
  ) {
    this.time = new DbTime(shift.offsetMs, partitions.widthMs, retentionMs);
  }

  /** The time the statements read: the database's `now()`, moved by the time shift (db-time.ts). */
  get dbTime(): DbTime {
    if (this.time.offsetMs !== this.shift.offsetMs) {
      this.time = new DbTime(this.shift.offsetMs, this.partitions.widthMs, this.retentionMs);
    }
    return this.time;
  }

  /** The database's time (moved by the time shift) in epoch ms, read now, and the skew hint with it. */
  async dbNowMs(): Promise<number> {
    const before = Date.now();
    const { rows } = await this.db.query<{ ms: number }>(
      "SELECT (extract(epoch FROM now()) * 1000)::float8 AS ms",
    );
    const ms = Number(rows[0]!.ms);
    this.skewMs = ms - (before + Date.now()) / 2;
    return ms + this.shift.offsetMs;
  }

  /**
   * This process's estimate of the database's time (moved by the shift), in epoch ms: a hint, never a
   * decision (which partitions a statement names, when to make partitions ahead, how long a duplicate
   * has waited); the statements decide.
   */
  estimatedNowMs(): number {
    return Date.now() + this.skewMs + this.shift.offsetMs;
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
    this.madeThrough(through);
  }

  /**
   * The partitions of now when this process's estimate of the database's clock says they may be
   * missing (undefined: none due). A partition still missing at an insert is made then
   * (`remakePartitions`).
   */
  ensureCurrentPartitions(): Promise<void> | undefined {
    return this.partitions.bucketOf(this.estimatedNowMs()) > this.ensuredThrough
      ? this.ensurePartitions()
      : undefined;
  }

  /** A key row's partition was missing at the insert: make the partitions again. */
  remakePartitions(): Promise<void> {
    this.ensuredThrough = Number.NEGATIVE_INFINITY;
    return this.ensurePartitions();
  }

  /** The partitions through `bucket` exist (made by a sweep). */
  madeThrough(bucket: number): void {
    this.ensuredThrough = Math.max(this.ensuredThrough, bucket);
  }
}
