import type { Db } from "./db.ts";

/** Bucket arithmetic and partition upkeep for the keys table. */
export class Partitions {
  constructor(
    private readonly db: Db,
    private readonly schema: string,
    /** Width of one partition in milliseconds. */
    readonly widthMs: number,
  ) {}

  bucketOf(atMs: number): number {
    return Math.floor(atMs / this.widthMs);
  }

  startOf(bucket: number): number {
    return bucket * this.widthMs;
  }

  private nameOf(bucket: number): string {
    return `keys_b${bucket}`;
  }

  /** Create the partitions for these buckets if they do not exist (several instances may race). */
  async ensure(buckets: Iterable<number>): Promise<void> {
    for (const b of new Set(buckets)) {
      try {
        await this.db.exec(
          `CREATE TABLE IF NOT EXISTS ${this.schema}.${this.nameOf(b)} PARTITION OF ${this.schema}.keys ` +
            `FOR VALUES FROM (${b}) TO (${b + 1})`,
        );
      } catch (err) {
        // Another instance created it between our check and our CREATE.
        const code = (err as { code?: string }).code;
        if (code !== "42P07" && code !== "23505") throw err;
      }
    }
  }

  /** The buckets that have a partition, oldest first. */
  async list(): Promise<number[]> {
    const { rows } = await this.db.query<{ name: string }>(
      `SELECT c.relname AS name FROM pg_inherits i
         JOIN pg_class c ON c.oid = i.inhrelid
         JOIN pg_class p ON p.oid = i.inhparent
         JOIN pg_namespace n ON n.oid = p.relnamespace
        WHERE n.nspname = $1 AND p.relname = 'keys'`,
      [this.schema],
    );
    return rows
      .map((r) => /^keys_b(-?\d+)$/.exec(r.name)?.[1])
      .filter((b): b is string => b !== undefined)
      .map(Number)
      .sort((a, b) => a - b);
  }

  /**
   * Drop every partition whose newest possible key is older than the retention window: bucket `b`
   * holds keys created before `start(b + 1)`, so it goes once `start(b + 1) + retention <= now`.
   * A whole partition is dropped in one statement; no row-by-row DELETE, no dead tuples to vacuum.
   */
  async dropExpired(nowMs: number, retentionMs: number): Promise<number[]> {
    const dropped: number[] = [];
    for (const b of await this.list()) {
      if (this.startOf(b + 1) + retentionMs > nowMs) break;
      await this.db.exec(`DROP TABLE IF EXISTS ${this.schema}.${this.nameOf(b)}`);
      dropped.push(b);
    }
    return dropped;
  }
}
