/**
 * (The claim, publish and mark loop lives here; its options and counters in relay-options.ts; a batch's
 * way to the broker, with a chain per aggregate when ordered, in relay-batch.ts; its SQL in
 * relay-sql.ts; the requeue/parking tools in outbox-admin.ts.)
 *
 * The outbox relay: takes events committed into `<schema>.outbox` and publishes them, at least once,
 * with the event id as the broker's message id.
 *
 * Timeline of one batch (any number of relays, and loops within one relay, run this concurrently):
 *
 *   claim    one short transaction: pick up to `batchSize` unpublished rows whose lock has expired
 *            (`FOR UPDATE SKIP LOCKED`, so concurrent relays never wait on or take each other's rows)
 *            and set `locked_until = now() + leaseMs`. Committed at once: no transaction stays open
 *            while the broker is talked to.
 *   publish  hand the batch to the publisher, which resolves once the broker confirmed each message
 *            (with `orderByAggregate`, a chain per aggregate: see relay-batch.ts).
 *   mark     as confirms come in, confirmed rows get `published_at`; failed ones `attempts + 1`,
 *            `last_error` and a backoff (as `locked_until`), and at `maxAttempts` a row is parked;
 *            rows the broker lost (a connection cut, no ack in time) go back without an attempt,
 *            to be tried again within a second.
 *   again    a batch that found work is followed by the next claim at once; the relay sleeps
 *            (`pollMs`, or until NOTIFY) only after a claim that found nothing, and a timer wakes it
 *            when the earliest backoff it set ends.
 *
 * A relay that dies anywhere in between leaves its rows locked until the lease expires; then they are
 * claimed and published again. The copy is a duplicate with the same message id, which NATS drops
 * within its window and every inbox drops for good. That is the whole of "at least once".
 */
import type { Db } from "../core/db.ts";
import type { Listen } from "../postgres/drivers/listen.ts";
import { placedOnCitus } from "../postgres/schema/citus.ts";
import { outboxNotifyTrigger, schemaOf } from "../postgres/schema/migrate.ts";
import { countParked } from "./observe.ts";
import { Alarms, marker, publishBatch } from "./relay-batch.ts";
import {
  POLL_WITHOUT_LISTEN_MS,
  positive,
  type RelayCrashPoint,
  type RelayOptions,
  type RelayStats,
} from "./relay-options.ts";
import { pipelined } from "./relay-pipeline.ts";
import { type Row, statements, toMessage } from "./relay-sql.ts";
import {
  errorOf,
  isBrokerUnavailable,
  type OutboxMessage,
  type Publisher,
  type PublishOutcome,
} from "./types.ts";

export { outboxCounts, requeueParked } from "./outbox-admin.ts";
export type { RelayCrashPoint, RelayOptions, RelayStats } from "./relay-options.ts";

/** Thrown inside a relay loop by a test's crash point; the loop stops dead. */
class RelayCrash extends Error {}

/** The wait after the broker could not be reached `streak` times in a row: 250 ms, 500 ms, then 1 s. */
function brokerWaitMs(streak: number): number {
  return Math.min(1_000, 250 * 2 ** Math.max(0, streak - 1));
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
  /** What the relay has done so far. */
  readonly stats: RelayStats = {
    batches: 0,
    published: 0,
    duplicates: 0,
    failed: 0,
    parked: 0,
    unavailable: 0,
    deleted: 0,
    reordered: 0,
  };
  readonly #db: Db;
  readonly #publisher: Publisher;
  readonly #sql: ReturnType<typeof statements>;
  readonly #channel: string;
  readonly #topics: string | undefined;
  readonly #ordered: boolean;
  readonly #pipelined: ReturnType<typeof pipelined>;
  readonly #batchSize: number;
  readonly #concurrency: number;
  readonly #leaseMs: number;
  readonly #maxAttempts: number;
  readonly #baseMs: number;
  readonly #capMs: number;
  readonly #listen: Listen | undefined;
  #pollMs: number;
  readonly #pollMsGiven: boolean;
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
  /** Wakes the loops when rows this relay put off (backoff, broker away) become claimable. */
  readonly #alarms = new Alarms(() => this.#wake());
  #claims: Promise<unknown> = Promise.resolve();
  readonly #schema: string;
  /** Whether the outbox is on Citus (asked once, by an ordered relay's first claim). */
  #citus: Promise<boolean> | undefined;

  constructor(options: RelayOptions) {
    const schema = schemaOf(options);
    this.#db = options.db;
    this.#schema = schema;
    this.#publisher = options.publisher;
    this.#topics = options.topics ? JSON.stringify(options.topics) : undefined;
    this.#ordered = options.orderByAggregate ?? false;
    this.#pipelined = pipelined(options, this.stats);
    this.#sql = statements(schema, this.#ordered, this.#topics !== undefined);
    this.#channel = `${schema}_outbox`;
    this.#batchSize = positive(options.batchSize ?? 500, "batchSize");
    this.#concurrency = positive(options.concurrency ?? 1, "concurrency");
    this.#leaseMs = positive(options.leaseMs ?? 30_000, "leaseMs");
    this.#maxAttempts = positive(options.maxAttempts ?? 10, "maxAttempts");
    this.#baseMs = options.backoff?.baseMs ?? 1_000;
    this.#capMs = options.backoff?.capMs ?? 300_000;
    this.#listen = options.listen;
    this.#pollMs = positive(options.pollMs ?? (options.listen ? 5_000 : POLL_WITHOUT_LISTEN_MS), "pollMs");
    this.#pollMsGiven = options.pollMs !== undefined;
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
        // Polling still finds the work: as often as without a listener, and said so.
        if (!this.#pollMsGiven) this.#pollMs = POLL_WITHOUT_LISTEN_MS;
        const e = errorOf(err);
        this.#onError(new Error(`${e.message}; polling every ${this.#pollMs} ms instead`, { cause: e }));
      }
      if (this.#subscription && (await this.#notifyDropped())) {
        if (!this.#pollMsGiven) this.#pollMs = POLL_WITHOUT_LISTEN_MS;
        this.#onError(
          new Error(
            `${this.#schema}.outbox has no NOTIFY trigger (migrate with outboxNotify: false, or Citus): ` +
              "only events written through idem's drivers or ORM integrations wake this relay; polling every " +
              `${this.#pollMs} ms for the others`,
          ),
        );
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

  /** Whether the outbox's wake-up trigger is gone (`MigrateOptions.outboxNotify`). False when unsure. */
  async #notifyDropped(): Promise<boolean> {
    try {
      return (await outboxNotifyTrigger(this.#db, this.#schema)) === false;
    } catch {
      return false; // the database is away: the loops will say so
    }
  }

  /**
   * Stop: the loops finish the batch in hand (publish and mark), then end; the LISTEN subscription and
   * the publisher's connections are closed, so that nothing of the relay's keeps the process alive (the
   * database is yours to close). Rows of a batch that could not finish stay locked until their lease
   * expires, as after a crash. A later `start()` works again: the publishers reconnect on their next batch.
   */
  async stop(): Promise<void> {
    this.#running = false;
    clearInterval(this.#cleanupTimer);
    this.#alarms.clear();
    this.#wake(true);
    await Promise.all(this.#loops);
    this.#loops = [];
    await this.#subscription?.close().catch(() => {});
    this.#subscription = undefined;
    await this.#publisher.close().catch((e) => this.#onError(errorOf(e)));
  }

  /** Wake idle loops now (what a NOTIFY does). */
  wake(): void {
    this.#wake();
  }

  /**
   * Claim, publish and mark one batch. Resolves with the number of rows claimed (0: nothing to do).
   * Throws what the database throws; a broker failure is recorded on the rows, not thrown.
   *
   * With `orderByAggregate` a batch may hold several events of one aggregate. Each aggregate's events
   * then go out one after the other, each once the broker confirmed the previous one, while the other
   * aggregates go their own pace (relay-batch.ts). An aggregate whose event failed sends nothing more
   * in this batch; its later events are put back, held behind the failed one until it is published.
   */
  async runOnce(): Promise<number> {
    const { rows } = await this.#claim();
    if (rows.length === 0) return 0;
    this.#maybeCrash("after-claim");
    const batch = rows.map(toMessage).sort((a, b) => (a.id < b.id ? -1 : 1));
    this.stats.batches++;
    const marks = marker(
      (messages, outcomes) => this.#mark(messages, outcomes),
      () => {
        if (this.#crashed || this.#crash?.("after-publish")) this.#crashed = true;
        return !this.#crashed;
      },
    );
    const end = this.#pipelined
      ? await this.#pipelined(batch, marks.sink)
      : await publishBatch(this.#publisher, batch, this.#ordered, marks.sink);
    const lost = await marks.settled(); // throws a database error
    if (this.#crashed) throw new RelayCrash("after-publish");
    if (end.unavailable) {
      // Nobody's fault: put what was not sent back now, count nothing, and let the loop back off.
      this.#onError(end.unavailable);
      await this.#db.query(this.#sql.release, [end.unsent.join(","), end.unavailable.message]);
    }
    if (end.held.length > 0) await this.#db.query(this.#sql.release, [end.held.join(","), null]);
    if (end.unavailable || lost > 0) {
      this.stats.unavailable++;
      this.#unavailableStreak++;
    } else this.#unavailableStreak = 0;
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

  /** Record outcomes on their rows. Resolves with the number the broker lost (held, no attempt). */
  async #mark(batch: readonly OutboxMessage[], outcomes: readonly PublishOutcome[]): Promise<number> {
    const ok: string[] = [];
    const lost: string[] = [];
    let lostError: Error | undefined;
    const failures = new Map<string, string[]>(); // error message -> ids
    outcomes.forEach((o, i) => {
      const id = batch[i]!.id;
      if (o.ok) {
        ok.push(id);
        if (o.duplicate) this.stats.duplicates++;
      } else if (isBrokerUnavailable(o.error)) {
        lost.push(id);
        lostError ??= o.error;
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
    if (lostError) {
      const waitMs = brokerWaitMs(this.#unavailableStreak + 1);
      await this.#db.query(this.#sql.hold, [lost.join(","), lostError.message.slice(0, 2_000), waitMs]);
      this.#wakeAt(Date.now() + waitMs);
      this.#onError(lostError);
    }
    for (const [message, ids] of failures) {
      const jitter = 0.5 + Math.random() / 2;
      const { rows } = await this.#db.query<{ parked: boolean; attempts: number }>(this.#sql.failed, [
        ids.join(","),
        message,
        this.#baseMs,
        this.#capMs,
        this.#maxAttempts,
        jitter,
      ]);
      const now = Date.now();
      for (const attempts of new Set(rows.filter((r) => !r.parked).map((r) => Number(r.attempts)))) {
        this.#wakeAt(now + Math.min(this.#capMs, this.#baseMs * 2 ** (attempts - 1)) * jitter);
      }
      this.stats.failed += ids.length;
      this.stats.parked += rows.filter((r) => r.parked).length;
      countParked(rows.filter((r) => r.parked).length);
      this.#onError(new Error(`publishing ${ids.length} event(s) failed: ${message}`));
    }
    return lost.length;
  }

  /**
   * One claim. Ordered claims of one relay go one at a time: the ordered claim locks candidates it may
   * then leave (an older event of theirs is unpublished), and a loop whose claim skipped such a locked
   * row while the other's claim, on an older snapshot, left it, would both find nothing and sleep.
   */
  #claim() {
    const claim = () => this.#db.query<Row>(this.#sql.claim, this.#claimParams());
    if (!this.#ordered) return claim();
    const p = this.#claims.then(async () => {
      this.#citus ??= placedOnCitus(this.#db, this.#schema).catch((e) => {
        this.#citus = undefined;
        throw e;
      });
      return (await this.#citus) ? this.#claimInTwo() : claim();
    });
    this.#claims = p.catch(() => {});
    return p;
  }

  /**
   * The ordered claim on Citus, where its UPDATE fails (relay-sql.ts): the selection locks and returns
   * the ids, then an UPDATE by primary key claims them, in one transaction (a round trip more).
   */
  #claimInTwo() {
    return this.#db.transaction(async (tx) => {
      const { rows } = await tx.query<{ id: string }>(this.#sql.claimSelect, this.#claimParams());
      if (rows.length === 0) return { rows: [] as Row[] };
      const ids = rows.map((r) => r.id).join(",");
      return tx.query<Row>(this.#sql.claimIds, [ids, this.#leaseMs]);
    });
  }

  /** Wake the loops at `at` (process clock), when rows put off until then become claimable. */
  #wakeAt(at: number): void {
    if (this.#running) this.#alarms.at(at);
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
        await this.#idle(Math.min(2_000, 250 * 2 ** Math.min(dbErrors, 7)));
        continue;
      }
      if (this.#unavailableStreak > 0) {
        await this.#idle(brokerWaitMs(this.#unavailableStreak), false);
      } else if (claimed > 0 && this.#ordered && this.#concurrency > 1) {
        // Publishing this batch made later events of its aggregates claimable: a sibling loop that
        // found nothing meanwhile (or is finding nothing on an older snapshot) claims again.
        this.#wake();
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

  /** Wake sleeping loops (`all`: even those waiting out an outage); if none sleeps, the next won't. */
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
