/**
 * The outbox relay: takes events committed into `<schema>.outbox` and publishes them, at least once,
 * with the event id as the broker's message id.
 *
 * Timeline of one batch (any number of relays, and loops within one relay, run this concurrently):
 *
 *   claim    one short transaction: pick up to `batchSize` unpublished rows whose lock has expired
 *            (`FOR UPDATE SKIP LOCKED`, so concurrent relays never wait on or take each other's rows)
 *            and set `locked_until = now() + leaseMs`. Committed at once: no transaction stays open
 *            while the broker is talked to.
 *   publish  hand the batch to the publisher, which resolves once the broker confirmed each message.
 *   mark     confirmed rows get `published_at`; failed ones `attempts + 1`, `last_error` and a
 *            backoff (as `locked_until`); at `maxAttempts` a row is parked.
 *
 * A relay that dies anywhere in between leaves its rows locked until the lease expires; then they are
 * claimed and published again. The copy is a duplicate with the same message id, which NATS drops
 * within its window and every inbox drops for good. That is the whole of "at least once".
 */
import type { Db } from "../core/db.ts";
import { checkSchemaName } from "../postgres/migrate.ts";
import type { Listen } from "./listen.ts";
import {
  errorOf,
  isBrokerUnavailable,
  type OutboxMessage,
  type Publisher,
  type PublishOutcome,
} from "./types.ts";

/** Points where a test can make a relay die as a killed process would: nothing is released or marked. */
export type RelayCrashPoint = "after-claim" | "after-publish";

/** Options of {@link Relay}. Only `db` and `publisher` are required. */
export interface RelayOptions {
  db: Db;
  publisher: Publisher;
  /** The schema idem's tables live in. Default `"idem"`. */
  schema?: string;
  /** Rows claimed per batch. Default 500. */
  batchSize?: number;
  /** Claim-publish-mark loops run side by side in this relay. Default 1. */
  concurrency?: number;
  /**
   * How long a claim keeps other relays off its rows. A relay that dies is replaced after this long, so
   * keep it above the slowest publish of a batch. Default 30,000 ms.
   */
  leaseMs?: number;
  /**
   * Publish the events of one aggregate (same `aggregate_type` and `aggregate_id`) strictly in the order
   * they were written: an event waits until every older event of its aggregate is published (a parked
   * one holds the rest back until it is requeued). Events without an aggregate id are unaffected.
   * Default false.
   */
  orderByAggregate?: boolean;
  /** Only these topics (so one relay can serve RabbitMQ and another webhooks). Default: every topic. */
  topics?: readonly string[];
  /** Failed publishes after which a row is parked with its last error. Default 10. */
  maxAttempts?: number;
  /**
   * Wait before retrying a failed row: `min(capMs, baseMs * 2^(attempts-1))`, jittered to 50-100%.
   * Defaults: baseMs 1,000, capMs 300,000 (10 attempts take about 20 minutes before parking).
   */
  backoff?: { baseMs?: number; capMs?: number };
  /** Wake up on NOTIFY (see `listenWithPg` & co). Default: none, polling only. */
  listen?: Listen;
  /** How often an idle relay looks for work anyway. Default 5,000 ms with `listen`, 500 ms without. */
  pollMs?: number;
  /** Published rows older than this are deleted. 0 keeps them. Default 86,400,000 (24 h). */
  retentionMs?: number;
  /** How often the retention delete runs. Default 600,000 (10 min). */
  cleanupEveryMs?: number;
  /** Called with failures the relay survived (broker down, database errors). Default: none. */
  onError?: (err: Error) => void;
  /** For tests: return true to die at this point, like a killed process. */
  crash?: (point: RelayCrashPoint) => boolean;
}

/** What a relay has done so far. */
export interface RelayStats {
  batches: number;
  published: number;
  /** Of `published`: confirmed by the broker as already present (NATS's duplicate window). */
  duplicates: number;
  /** Failed publishes (each counts an attempt on its row). */
  failed: number;
  parked: number;
  /** Batches put back because the broker could not be reached. */
  unavailable: number;
  deleted: number;
}

/** Thrown inside a relay loop by a test's crash point; the loop stops dead. */
class RelayCrash extends Error {}

interface Row {
  id: string;
  topic: string;
  type: string;
  body: string;
  headers: Record<string, string> | string | null;
  aggregate_type: string | null;
  aggregate_id: string | null;
  attempts: number;
  created_at: Date | string;
}

/** The three statements a relay runs, built once per schema and option set. */
function statements(schema: string, ordered: boolean, filtered: boolean) {
  const t = `${schema}.outbox`;
  const returning = `RETURNING o.id::text AS id, o.topic, o.type, o.payload::text AS body, o.headers::text AS headers,
              o.aggregate_type, o.aggregate_id, o.attempts, o.created_at`;
  const claimable = `o.published_at IS NULL AND o.parked_at IS NULL
        AND (o.locked_until IS NULL OR o.locked_until <= now())
        ${filtered ? "AND o.topic IN (SELECT jsonb_array_elements_text($3::text::jsonb))" : ""}`;
  const claim = ordered
    ? /*
       * Ordered: a run of events per aggregate (the relay publishes them in waves, in order).
       *   held        aggregates with an unpublished event in flight, backing off or parked (few rows:
       *               the partial index outbox_held): none of their events may go now.
       *   candidates  the oldest claimable events of the other aggregates, row-locked.
       *   the UPDATE  keeps an event only if every older unpublished event of its aggregate is a
       *               candidate too. (A concurrent claim may hold an older one's row lock, which SKIP
       *               LOCKED passes over, or may have committed after this statement's snapshot.)
       * The ids go to the UPDATE as an array, so it finds them by primary key.
       */
      `
    WITH held AS (
      SELECT DISTINCT aggregate_type, aggregate_id FROM ${t}
      WHERE published_at IS NULL AND aggregate_id IS NOT NULL
        AND (parked_at IS NOT NULL OR locked_until IS NOT NULL)
        AND (parked_at IS NOT NULL OR locked_until > now())
    ), candidates AS (
      SELECT o.id, o.aggregate_type, o.aggregate_id FROM ${t} o
      WHERE ${claimable}
        AND NOT EXISTS (SELECT 1 FROM held h WHERE h.aggregate_id = o.aggregate_id
                          AND h.aggregate_type IS NOT DISTINCT FROM o.aggregate_type)
      ORDER BY o.id
      LIMIT $1::int
      FOR UPDATE SKIP LOCKED
    ), ranked AS (
      SELECT id, aggregate_type, aggregate_id,
             row_number() OVER (PARTITION BY aggregate_type, aggregate_id ORDER BY id) - 1 AS older
      FROM candidates
    )
    UPDATE ${t} o SET locked_until = now() + $2::int * interval '1 millisecond'
    WHERE o.id = ANY (ARRAY(
      SELECT r.id FROM ranked r
      WHERE r.aggregate_id IS NULL OR r.older = (
        SELECT count(*) FROM ${t} p
        WHERE p.aggregate_id = r.aggregate_id AND p.published_at IS NULL AND p.id < r.id
          AND p.aggregate_type IS NOT DISTINCT FROM r.aggregate_type)))
    ${returning}`
    : `
    WITH claimed AS (
      SELECT o.id FROM ${t} o
      WHERE ${claimable}
      ORDER BY o.id
      LIMIT $1::int
      FOR UPDATE SKIP LOCKED
    )
    UPDATE ${t} o SET locked_until = now() + $2::int * interval '1 millisecond'
    FROM claimed WHERE o.id = claimed.id
    ${returning}`;
  const published = `
    UPDATE ${t} SET published_at = now(), locked_until = NULL, last_error = NULL
    WHERE id = ANY(string_to_array($1::text, ',')::uuid[]) AND published_at IS NULL`;
  const failed = `
    UPDATE ${t} SET
      attempts = attempts + 1,
      last_error = $2::text,
      locked_until = now() + least($4::float8, $3::float8 * power(2, attempts)) * (0.5 + random() / 2)
                             * interval '1 millisecond',
      parked_at = CASE WHEN attempts + 1 >= $5::int THEN now() END
    WHERE id = ANY(string_to_array($1::text, ',')::uuid[]) AND published_at IS NULL
    RETURNING parked_at IS NOT NULL AS parked`;
  const release = `
    UPDATE ${t} SET locked_until = NULL, last_error = coalesce($2::text, last_error)
    WHERE id = ANY(string_to_array($1::text, ',')::uuid[]) AND published_at IS NULL`;
  const cleanup = `
    DELETE FROM ${t} WHERE id IN (
      SELECT id FROM ${t} WHERE published_at < now() - $1::float8 * interval '1 millisecond'
      ORDER BY published_at LIMIT $2::int)`;
  return { claim, published, failed, release, cleanup };
}

function toMessage(r: Row): OutboxMessage {
  const headers =
    typeof r.headers === "string" ? (JSON.parse(r.headers) as Record<string, string>) : r.headers;
  return {
    id: r.id,
    topic: r.topic,
    type: r.type,
    body: r.body,
    headers: headers ?? {},
    aggregateType: r.aggregate_type,
    aggregateId: r.aggregate_id,
    attempts: Number(r.attempts),
    createdAt: r.created_at instanceof Date ? r.created_at : new Date(r.created_at),
  };
}

function aggregateKey(m: OutboxMessage): string {
  return `${m.aggregateType ?? ""}\u0000${m.aggregateId}`;
}

/**
 * Split a batch (sorted by id) into waves: wave i holds the i-th event of each aggregate. Events
 * without an aggregate go in the first wave.
 */
function wavesOf(batch: OutboxMessage[]): OutboxMessage[][] {
  const waves: OutboxMessage[][] = [];
  const seen = new Map<string, number>();
  for (const m of batch) {
    let i = 0;
    if (m.aggregateId !== null) {
      const k = aggregateKey(m);
      i = seen.get(k) ?? 0;
      seen.set(k, i + 1);
    }
    const wave = waves[i];
    if (wave) wave.push(m);
    else waves[i] = [m];
  }
  return waves;
}

/**
 * A relay. `start()` runs it until `stop()`; `runOnce()` processes one batch (for scripts and tests).
 *
 *   const relay = new Relay({ db, publisher: new AmqpPublisher({ url }), listen: listenWithPg(...) });
 *   relay.start();
 *   ...
 *   await relay.stop();
 */
export class Relay {
  readonly stats: RelayStats = {
    batches: 0,
    published: 0,
    duplicates: 0,
    failed: 0,
    parked: 0,
    unavailable: 0,
    deleted: 0,
  };
  readonly #db: Db;
  readonly #publisher: Publisher;
  readonly #sql: ReturnType<typeof statements>;
  readonly #channel: string;
  readonly #topics: string | undefined;
  readonly #ordered: boolean;
  readonly #batchSize: number;
  readonly #concurrency: number;
  readonly #leaseMs: number;
  readonly #maxAttempts: number;
  readonly #baseMs: number;
  readonly #capMs: number;
  readonly #listen: Listen | undefined;
  readonly #pollMs: number;
  readonly #retentionMs: number;
  readonly #cleanupEveryMs: number;
  readonly #onError: (err: Error) => void;
  readonly #crash: ((point: RelayCrashPoint) => boolean) | undefined;
  #running = false;
  #loops: Promise<void>[] = [];
  #sleepers = new Set<{ wakeable: boolean; done: () => void }>();
  #pending = false; // a notification arrived while every loop was busy
  #subscription: { close(): Promise<void> } | undefined;
  #cleanupTimer: NodeJS.Timeout | undefined;
  #unavailableStreak = 0;
  #crashed = false;

  constructor(options: RelayOptions) {
    const schema = checkSchemaName(options.schema ?? "idem");
    this.#db = options.db;
    this.#publisher = options.publisher;
    this.#topics = options.topics ? JSON.stringify(options.topics) : undefined;
    this.#ordered = options.orderByAggregate ?? false;
    this.#sql = statements(schema, this.#ordered, this.#topics !== undefined);
    this.#channel = `${schema}_outbox`;
    this.#batchSize = positive(options.batchSize ?? 500, "batchSize");
    this.#concurrency = positive(options.concurrency ?? 1, "concurrency");
    this.#leaseMs = positive(options.leaseMs ?? 30_000, "leaseMs");
    this.#maxAttempts = positive(options.maxAttempts ?? 10, "maxAttempts");
    this.#baseMs = options.backoff?.baseMs ?? 1_000;
    this.#capMs = options.backoff?.capMs ?? 300_000;
    this.#listen = options.listen;
    this.#pollMs = positive(options.pollMs ?? (options.listen ? 5_000 : 500), "pollMs");
    this.#retentionMs = options.retentionMs ?? 86_400_000;
    this.#cleanupEveryMs = positive(options.cleanupEveryMs ?? 600_000, "cleanupEveryMs");
    this.#onError = options.onError ?? (() => {});
    this.#crash = options.crash;
  }

  /** True between `start()` and `stop()` (false as well once a test crash point killed it). */
  get running(): boolean {
    return this.#running && !this.#crashed;
  }

  /** Start the loops (and the LISTEN subscription). Resolves once the relay listens. */
  async start(): Promise<void> {
    if (this.#running) return;
    this.#running = true;
    this.#crashed = false;
    if (this.#listen) {
      try {
        this.#subscription = await this.#listen(this.#channel, () => this.#wake());
      } catch (err) {
        this.#onError(errorOf(err)); // polling still finds the work
      }
    }
    for (let i = 0; i < this.#concurrency; i++) this.#loops.push(this.#loop());
    if (this.#retentionMs > 0) {
      const tick = () => {
        this.cleanup().catch((e) => this.#onError(errorOf(e)));
      };
      this.#cleanupTimer = setInterval(tick, this.#cleanupEveryMs);
      this.#cleanupTimer.unref();
    }
  }

  /**
   * Stop: the loops finish the batch in hand (publish and mark), then end. Rows of a batch that could
   * not finish stay locked until their lease expires, as after a crash.
   */
  async stop(): Promise<void> {
    this.#running = false;
    clearInterval(this.#cleanupTimer);
    this.#wake(true);
    await Promise.all(this.#loops);
    this.#loops = [];
    await this.#subscription?.close().catch(() => {});
    this.#subscription = undefined;
  }

  /** Wake idle loops now (what a NOTIFY does). */
  wake(): void {
    this.#wake();
  }

  /**
   * Claim, publish and mark one batch. Resolves with the number of rows claimed (0: nothing to do).
   * Throws what the database throws; a broker failure is recorded on the rows, not thrown.
   *
   * With `orderByAggregate` a batch may hold several events of one aggregate. It is then published in
   * waves: the first event of every aggregate, then (once the broker confirmed those) the second, and
   * so on. An aggregate whose event failed sends nothing more in this batch; its later events are put
   * back, held behind the failed one until it is published.
   */
  async runOnce(): Promise<number> {
    const { rows } = await this.#db.query<Row>(this.#sql.claim, this.#claimParams());
    if (rows.length === 0) return 0;
    this.#maybeCrash("after-claim");
    const batch = rows.map(toMessage).sort((a, b) => (a.id < b.id ? -1 : 1));
    this.stats.batches++;
    const held: string[] = [];
    const failedAggregates = new Set<string>();
    // Each wave is marked as soon as it is confirmed, while the next one is on its way to the broker.
    const marking: Promise<unknown>[] = [];
    const markWave = (wave: OutboxMessage[], got: PublishOutcome[]) => {
      this.#maybeCrash("after-publish");
      marking.push(this.#mark(wave, got).catch((err: unknown) => ({ failed: err })));
    };
    const settle = async () => {
      for (const r of await Promise.all(marking)) {
        if (r && typeof r === "object" && "failed" in r) throw r.failed;
      }
    };
    const waves = this.#ordered ? wavesOf(batch) : [batch];
    try {
      for (let w = 0; w < waves.length; w++) {
        const wave = waves[w]!.filter((m) => {
          const blocked = m.aggregateId !== null && failedAggregates.has(aggregateKey(m));
          if (blocked) held.push(m.id);
          return !blocked;
        });
        if (wave.length === 0) continue;
        let got: PublishOutcome[];
        try {
          got = await this.#publisher.publish(wave);
          if (got.length !== wave.length) {
            throw new Error(`publisher ${this.#publisher.name} answered ${got.length} of ${wave.length}`);
          }
        } catch (err) {
          const error = errorOf(err);
          if (isBrokerUnavailable(error)) {
            // Nobody's fault: put the rest back now, count nothing, and let the loop back off.
            this.stats.unavailable++;
            this.#unavailableStreak++;
            this.#onError(error);
            const rest = [...wave, ...waves.slice(w + 1).flat()].map((m) => m.id);
            await this.#db.query(this.#sql.release, [rest.join(","), error.message]);
            if (held.length > 0) await this.#db.query(this.#sql.release, [held.join(","), null]);
            await settle();
            return batch.length;
          }
          got = wave.map(() => ({ ok: false, error }));
        }
        wave.forEach((m, i) => {
          if (!got[i]!.ok && m.aggregateId !== null) failedAggregates.add(aggregateKey(m));
        });
        this.#unavailableStreak = 0;
        markWave(wave, got);
      }
      if (held.length > 0) await this.#db.query(this.#sql.release, [held.join(","), null]);
    } catch (err) {
      await Promise.all(marking);
      throw err;
    }
    await settle();
    return batch.length;
  }

  /** Delete published rows past retention, a bounded chunk at a time. Resolves with the rows deleted. */
  async cleanup(): Promise<number> {
    if (this.#retentionMs <= 0) return 0;
    let total = 0;
    for (;;) {
      const { rowCount } = await this.#db.query(this.#sql.cleanup, [this.#retentionMs, 5_000]);
      total += rowCount;
      if (rowCount < 5_000) break;
    }
    this.stats.deleted += total;
    return total;
  }

  async #mark(batch: OutboxMessage[], outcomes: PublishOutcome[]): Promise<void> {
    const ok: string[] = [];
    const failures = new Map<string, string[]>(); // error message -> ids
    outcomes.forEach((o, i) => {
      const id = batch[i]!.id;
      if (o.ok) {
        ok.push(id);
        if (o.duplicate) this.stats.duplicates++;
      } else {
        const msg = (o.error.message || o.error.name).slice(0, 2_000);
        const ids = failures.get(msg);
        if (ids) ids.push(id);
        else failures.set(msg, [id]);
      }
    });
    if (ok.length > 0) {
      await this.#db.query(this.#sql.published, [ok.join(",")]);
      this.stats.published += ok.length;
    }
    for (const [message, ids] of failures) {
      const { rows } = await this.#db.query<{ parked: boolean }>(this.#sql.failed, [
        ids.join(","),
        message,
        this.#baseMs,
        this.#capMs,
        this.#maxAttempts,
      ]);
      this.stats.failed += ids.length;
      this.stats.parked += rows.filter((r) => r.parked).length;
      this.#onError(new Error(`publishing ${ids.length} event(s) failed: ${message}`));
    }
  }

  #claimParams(): unknown[] {
    const p: unknown[] = [this.#batchSize, this.#leaseMs];
    if (this.#topics !== undefined) p.push(this.#topics);
    return p;
  }

  #maybeCrash(point: RelayCrashPoint): void {
    if (this.#crashed || this.#crash?.(point)) {
      this.#crashed = true;
      throw new RelayCrash(point);
    }
  }

  async #loop(): Promise<void> {
    let dbErrors = 0;
    while (this.#running && !this.#crashed) {
      let claimed = 0;
      try {
        claimed = await this.runOnce();
        dbErrors = 0;
      } catch (err) {
        if (err instanceof RelayCrash) return;
        dbErrors++;
        this.#onError(errorOf(err));
        await this.#idle(Math.min(30_000, 250 * 2 ** Math.min(dbErrors, 7)));
        continue;
      }
      if (this.#unavailableStreak > 0) {
        await this.#idle(Math.min(30_000, 250 * 2 ** Math.min(this.#unavailableStreak - 1, 7)), false);
      } else if (claimed === 0) {
        // Idle only when there was nothing to claim. A short batch does not mean the backlog is gone:
        // with per-aggregate ordering, publishing it is what makes the next events claimable.
        await this.#idle(this.#pollMs);
      }
    }
  }

  /** Sleep `ms`, or less: a NOTIFY or `wake()` ends a `wakeable` sleep, `stop()` ends any. */
  #idle(ms: number, wakeable = true): Promise<void> {
    if (!this.#running) return Promise.resolve();
    if (wakeable && this.#pending) {
      this.#pending = false;
      return Promise.resolve();
    }
    return new Promise<void>((resolve) => {
      const sleeper = { wakeable, done: () => {} };
      const timer = setTimeout(() => sleeper.done(), ms);
      sleeper.done = () => {
        clearTimeout(timer);
        this.#sleepers.delete(sleeper);
        resolve();
      };
      this.#sleepers.add(sleeper);
    });
  }

  #wake(all = false): void {
    let woke = false;
    for (const s of [...this.#sleepers]) {
      if (s.wakeable || all) {
        s.done();
        woke = true;
      }
    }
    if (!woke && !all) this.#pending = true;
  }
}

/** Put parked rows back in the queue (all of them, or those of `ids` / `topic`), attempts reset. */
export async function requeueParked(
  db: Db,
  options: { schema?: string; ids?: readonly string[]; topic?: string } = {},
): Promise<number> {
  const schema = checkSchemaName(options.schema ?? "idem");
  const { rowCount } = await db.query(
    `UPDATE ${schema}.outbox SET parked_at = NULL, attempts = 0, locked_until = NULL
     WHERE parked_at IS NOT NULL AND published_at IS NULL
       AND ($1::text IS NULL OR id = ANY(string_to_array($1::text, ',')::uuid[]))
       AND ($2::text IS NULL OR topic = $2::text)`,
    [options.ids ? options.ids.join(",") : null, options.topic ?? null],
  );
  return rowCount;
}

/** Counts of the outbox's rows by state, for dashboards and tests. */
export async function outboxCounts(
  db: Db,
  options: { schema?: string } = {},
): Promise<{ pending: number; published: number; parked: number }> {
  const schema = checkSchemaName(options.schema ?? "idem");
  const { rows } = await db.query<{ pending: string; published: string; parked: string }>(
    `SELECT count(*) FILTER (WHERE published_at IS NULL AND parked_at IS NULL) AS pending,
            count(*) FILTER (WHERE published_at IS NOT NULL) AS published,
            count(*) FILTER (WHERE parked_at IS NOT NULL AND published_at IS NULL) AS parked
     FROM ${schema}.outbox`,
  );
  const r = rows[0]!;
  return { pending: Number(r.pending), published: Number(r.published), parked: Number(r.parked) };
}

function positive(n: number, name: string): number {
  if (!(n > 0) || !Number.isFinite(n)) throw new RangeError(`${name} must be a positive number, got ${n}`);
  return n;
}
