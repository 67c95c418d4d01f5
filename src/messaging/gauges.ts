/**
 * The numbers an operator watches, each read with one SQL statement of bounded cost (a partial index,
 * or a count capped at {@link GAUGE_COUNT_CAP}), so a scrape every few seconds costs next to nothing
 * however large the tables grow. The reference service serves them as Prometheus gauges
 * (app/observability.ts); `read()` gives them all at once for scripts and health pages.
 *
 * Unfinished keys are a store's figure rather than messaging's, but they are read the same way and
 * alongside the outbox and inbox, so they live here with them.
 */
import type { Db } from "../core/db.ts";
import { schemaOf } from "../postgres/schema/migrate.ts";

/** Counts stop at this many rows (a gauge at the cap means "at least this many"). */
export const GAUGE_COUNT_CAP = 100_000;

/** The gauges of one idem schema, as {@link IdemGauges} reads them. */
export interface GaugeValues {
  /** Phases-mode keys not finished yet, by recovery point (`started` or a phase name). */
  unfinishedKeys: Record<string, number>;
  /** Seconds since the least recently advanced unfinished key last moved (0 when none). */
  oldestUnfinishedKeySeconds: number;
  /** Outbox events parked after `maxAttempts` failed publishes, waiting to be requeued. */
  parkedOutboxEvents: number;
  /** Inbox messages parked after `maxAttempts` failed attempts, waiting to be unparked. */
  parkedInboxMessages: number;
  /** Age in seconds of the oldest event waiting to be published, parked ones aside (0 when none). */
  relayLagSeconds: number;
}

/** Reads the gauges of one idem schema. */
export class IdemGauges {
  readonly #db: Db;
  readonly #s: string;

  constructor(db: Db, options: { schema?: string } = {}) {
    this.#db = db;
    this.#s = schemaOf(options);
  }

  /** From the partial index keys_unfinished (as many rows as requests in progress), capped. */
  async unfinishedKeys(): Promise<Record<string, number>> {
    const { rows } = await this.#db.query<{ point: string; n: string }>(
      `SELECT recovery_point AS point, count(*) AS n FROM (
         SELECT recovery_point FROM ${this.#s}.keys
         WHERE recovery_point <> 'done' AND NOT marker LIMIT ${GAUGE_COUNT_CAP}) k
       GROUP BY recovery_point`,
    );
    return Object.fromEntries(rows.map((r) => [r.point, Number(r.n)]));
  }

  /** The first entry of keys_unfinished (ordered by updated_at). */
  async oldestUnfinishedKeySeconds(): Promise<number> {
    return this.#seconds(
      `SELECT extract(epoch FROM now() - min(updated_at))::float8 AS s FROM ${this.#s}.keys
       WHERE recovery_point <> 'done' AND NOT marker`,
    );
  }

  /** From the partial index outbox_parked, capped. */
  async parkedOutboxEvents(): Promise<number> {
    return this.#count(
      `SELECT count(*) AS n FROM (SELECT 1 FROM ${this.#s}.outbox
         WHERE parked_at IS NOT NULL AND published_at IS NULL LIMIT ${GAUGE_COUNT_CAP}) p`,
    );
  }

  /** Inbox messages parked after `maxAttempts` failed attempts (counted up to a cap). */
  async parkedInboxMessages(): Promise<number> {
    return this.#count(
      `SELECT count(*) AS n FROM (SELECT 1 FROM ${this.#s}.inbox_parked LIMIT ${GAUGE_COUNT_CAP}) p`,
    );
  }

  /** The first unpublished event by id (a UUIDv7, so the oldest), from the partial index outbox_unpublished. */
  async relayLagSeconds(): Promise<number> {
    return this.#seconds(
      `SELECT extract(epoch FROM now() - created_at)::float8 AS s FROM ${this.#s}.outbox
       WHERE published_at IS NULL AND parked_at IS NULL ORDER BY id LIMIT 1`,
    );
  }

  /** Every gauge, read side by side. */
  async read(): Promise<GaugeValues> {
    const [
      unfinishedKeys,
      oldestUnfinishedKeySeconds,
      parkedOutboxEvents,
      parkedInboxMessages,
      relayLagSeconds,
    ] = await Promise.all([
      this.unfinishedKeys(),
      this.oldestUnfinishedKeySeconds(),
      this.parkedOutboxEvents(),
      this.parkedInboxMessages(),
      this.relayLagSeconds(),
    ]);
    return {
      unfinishedKeys,
      oldestUnfinishedKeySeconds,
      parkedOutboxEvents,
      parkedInboxMessages,
      relayLagSeconds,
    };
  }

  async #count(sql: string): Promise<number> {
    const { rows } = await this.#db.query<{ n: string }>(sql);
    return Number(rows[0]?.n ?? 0);
  }

  async #seconds(sql: string): Promise<number> {
    const { rows } = await this.#db.query<{ s: number | null }>(sql);
    return Math.max(0, Number(rows[0]?.s ?? 0));
  }
}
