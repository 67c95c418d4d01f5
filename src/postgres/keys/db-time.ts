/**
 * Time as idem's statements read it: the database's clock, inside the statement, never a process's.
 *
 * Every decision between instances (is this lease still held? may I take it over? has this key
 * expired? which partition does a claim go to? which partitions are past retention?) compares times
 * in SQL against `now()`, so two instances whose clocks disagree by hours still agree on every answer:
 * they read one clock. A process's own clock is used for hints only (when to create partitions ahead,
 * which finished keys to read without a lock), each checked again by a statement that decides.
 *
 * `now()` is the start of the statement's transaction: in a transaction (atomic mode's lookup and
 * saved reply, a local phase) every statement reads the same instant, so a key row's `created_at`, its
 * bucket and the expiry checks of that transaction agree with each other.
 *
 * Tests move the time with a `TimeShift` (`PostgresStoreOptions.timeShift`): the statements then read
 * `now() + offset`, still the database's clock, moved by the same amount for every instance that
 * shares the shift.
 */

/**
 * How far past the database's now a lookup still reads partitions. Rows go to the bucket of the
 * database's now, so the partitions made ahead hold none: bounding the lookup spares their index
 * probes (docs/decisions/lookup-partition-bounds.md). The
 * margin keeps a row found if the database's clock stepped back after saving it (by less than this),
 * near a partition boundary.
 */
const LOOKUP_AHEAD_MS = 600_000;

/**
 * How far the process's estimate of the database's time may be off before a lookup whose partitions
 * are named by it (`rangeAround`) misses one: the statement then says so (`covers`), and the caller
 * reads by the database's clock alone.
 */
const HINT_MARGIN_MS = 60_000;

/** Partitions `lo` to `hi` (bucket numbers, both included). */
export interface BucketRange {
  lo: number;
  hi: number;
}

/** Moves the time the store's statements read by `offsetMs` (tests: expire leases and keys without waiting). */
export interface TimeShift {
  offsetMs: number;
}

/** The SQL expressions of one store's time: its shift, partition width and retention, as literals. */
export class DbTime {
  /** The time the statements read: `now()`, moved by the shift. */
  readonly now: string;
  /** The oldest live `created_at`: rows created at or before it have expired. */
  readonly oldest: string;
  /** The bucket of `oldest`: the first partition a lookup reads. */
  readonly oldestBucket: string;
  /** The bucket a row created now goes to. */
  readonly bucket: string;
  /** The last bucket a lookup reads (`LOOKUP_AHEAD_MS` past now): with `oldestBucket`, its window. */
  readonly newestBucket: string;
  /** Says which store configuration the statements were built for (a cache key). */
  readonly key: string;
  /** SQL: a lookup's partitions by the database's clock (two bucket numbers worked out per execution). */
  readonly window: string;
  /** The newest time a lookup reads the bucket of (`newestBucket`'s instant). */
  private readonly ahead: string;

  constructor(
    readonly offsetMs: number,
    readonly widthMs: number,
    readonly retentionMs: number,
  ) {
    const offset = Math.trunc(offsetMs);
    this.now = offset === 0 ? "now()" : `(now() + interval '${offset} milliseconds')`;
    this.oldest = `(${this.now} - interval '${Math.trunc(retentionMs)} milliseconds')`;
    this.bucket = this.bucketOf(this.now);
    this.oldestBucket = this.bucketOf(this.oldest);
    this.ahead = `(${this.now} + interval '${LOOKUP_AHEAD_MS} milliseconds')`;
    this.newestBucket = this.bucketOf(this.ahead);
    this.window = `bucket >= ${this.oldestBucket} AND bucket <= ${this.newestBucket}`;
    this.key = `${offset}/${widthMs}/${retentionMs}`;
  }

  /** SQL: the bucket (partition number) of a timestamptz expression. */
  bucketOf(at: string): string {
    return `floor(extract(epoch FROM ${at}) * 1000 / ${Math.trunc(this.widthMs)})::int`;
  }

  /**
   * The buckets a lookup reads by this process's estimate of the database's time (`estimatedMs`, a hint),
   * with a margin: named as constants in a statement, PostgreSQL prunes the other partitions when it
   * plans the statement (once per connection) instead of at every execution. `covers` checks them.
   */
  rangeAround(estimatedMs: number): BucketRange {
    return {
      lo: Math.floor((estimatedMs - this.retentionMs - HINT_MARGIN_MS) / this.widthMs),
      hi: Math.floor((estimatedMs + LOOKUP_AHEAD_MS + HINT_MARGIN_MS) / this.widthMs),
    };
  }

  /** SQL: the partitions `range` names, as constants (PostgreSQL prunes the others when it plans). */
  static named(range: BucketRange): string {
    return `bucket >= ${Math.trunc(range.lo)} AND bucket <= ${Math.trunc(range.hi)}`;
  }

  /**
   * `make` per range of partitions named from an estimate (`rangeAround`), keeping the last range's
   * value: an estimate moves on to a new range once per partition width, so statements are built then.
   */
  aroundEstimate<T>(make: (range: BucketRange) => T): (estimatedMs: number) => T {
    let last: (BucketRange & { value: T }) | undefined;
    return (estimatedMs) => {
      const range = this.rangeAround(estimatedMs);
      if (last?.lo !== range.lo || last.hi !== range.hi) last = { ...range, value: make(range) };
      return last.value;
    };
  }

  /**
   * SQL: whether buckets `lo`..`hi` hold every one the database's clock says a lookup must read. Said
   * with the instants where `lo` starts and `hi` ends, not with bucket numbers: `oldestBucket >= lo`
   * exactly when `oldest` is at or after the start of `lo`, and `newestBucket <= hi` exactly when the
   * lookup's newest instant is before the start of `hi + 1` (a bucket is epoch ms over the width, floored).
   * A bucket number is numeric arithmetic, which PostgreSQL would work out at every execution
   * (docs/decisions/named-partitions.md).
   */
  covers(range: BucketRange): string {
    const from = this.instantOf(Math.trunc(range.lo));
    const until = this.instantOf(Math.trunc(range.hi) + 1);
    return `(${this.oldest} >= ${from} AND ${this.ahead} < ${until})`;
  }

  /** SQL: the instant bucket `b` starts at, as an exact timestamptz literal. */
  private instantOf(b: number): string {
    return `'${new Date(b * Math.trunc(this.widthMs)).toISOString()}'::timestamptz`;
  }

  /**
   * SQL for an `ON CONFLICT ... DO UPDATE WHERE`: the stored row (`createdAt`) has expired, measured from
   * the inserted row's `created_at` (`insertedAt`, this store's now) in UTC, so only IMMUTABLE
   * functions: Citus refuses others there (same answer as `createdAt <= oldest`).
   */
  expiredAgainst(createdAt: string, insertedAt: string): string {
    const back = `interval '${Math.trunc(this.retentionMs)} milliseconds'`;
    return `(${createdAt} AT TIME ZONE 'UTC') <= (${insertedAt} AT TIME ZONE 'UTC') - ${back}`;
  }

  /** SQL: `at` moved by a number of milliseconds given as a statement parameter (`$n`). */
  static plusMs(at: string, param: string): string {
    return `(${at} + ${param}::float8 * interval '1 millisecond')`;
  }
}
