/**
 * What every broker's consumer shares: options, statistics, and the step from "a delivery arrived" to
 * "tell the broker ack, retry or done" through the inbox.
 */
import { deliveryEnded, deliveryStarted } from "../observability/messaging.ts";
import { type Inbox, type InboxBatchHandler, type InboxHandler, InboxResult } from "./inbox.ts";
import { type Delivery, errorOf } from "./types.ts";

/** Points where a test can make a consumer die as a killed process would (no ack, nothing closed cleanly). */
export type ConsumerCrashPoint = "after-commit";

/** Options shared by `consumeAmqp`, `consumeNats` and `MemoryBroker.consume`. */
export interface ConsumerOptions {
  /** The inbox that deduplicates, applies and parks. Its `consumer` name is this consumer's identity. */
  inbox: Inbox;
  /** The message's effect, run in the inbox's transaction. Give this or `batchHandler`. */
  handler?: InboxHandler;
  /** The effect of a batch of new messages at once (set-based SQL), instead of `handler`. */
  batchHandler?: InboxBatchHandler;
  /** Deliveries in hand at once, unacked (AMQP prefetch, NATS pull size). Default 256. */
  prefetch?: number;
  /**
   * Most deliveries applied in one transaction. Deliveries that arrive while the transactions are busy
   * are gathered into the next one, so a quiet consumer handles each message at once and a busy one
   * commits many per round trip. 1 gives a transaction per message. Default 64.
   */
  batchSize?: number;
  /** Transactions in flight at once. Default 4. */
  concurrency?: number;
  /** After a failed attempt, wait this long before the broker redelivers (where it can wait). Default 1,000 ms. */
  retryDelayMs?: number;
  /** Failures the consumer survived (connection lost, database down, refused messages). Default: none. */
  onError?: (err: Error) => void;
  /** For tests: return true to die at this point: the effect is committed, the ack never sent. */
  crash?: (point: ConsumerCrashPoint, message: Delivery) => boolean;
}

/** What a consumer has done so far. */
export interface ConsumerStats {
  /** Deliveries whose effect was applied (and marked) now. */
  applied: number;
  /** Deliveries dropped as already applied (the inbox had the message id). */
  duplicates: number;
  /** Deliveries that failed and were handed back for a retry. */
  retried: number;
  /** Messages parked after their last allowed attempt. */
  parked: number;
  /** Deliveries refused without processing (no producer message id). */
  refused: number;
}

/** A consumer at work. */
export interface RunningConsumer {
  /** What it has done so far. */
  readonly stats: ConsumerStats;
  /** Stop taking deliveries, let the ones in hand finish, then close. */
  stop(): Promise<void>;
  /** Resolves when the consumer has stopped, by `stop()` or by a test crash. */
  readonly closed: Promise<void>;
}

/** What the broker is to be told about one delivery. */
export type Verdict = "ack" | "retry" | "done-failed" | "crash";

export function newStats(): ConsumerStats {
  return { applied: 0, duplicates: 0, retried: 0, parked: 0, refused: 0 };
}

function verdictOf(
  options: ConsumerOptions,
  stats: ConsumerStats,
  d: Delivery,
  result: InboxResult,
): Verdict {
  deliveryEnded(d, result);
  switch (result) {
    case InboxResult.applied:
      stats.applied++;
      if (options.crash?.("after-commit", d)) return "crash";
      return "ack";
    case InboxResult.duplicate:
      stats.duplicates++;
      return "ack";
    case InboxResult.retry:
      stats.retried++;
      return "retry";
    case InboxResult.parked:
      stats.parked++;
      return "done-failed";
  }
}

/**
 * Runs deliveries through the inbox, gathering those that arrive while earlier transactions are busy
 * into batches, and resolves each with what the broker is to be told. "crash" means a test asked the
 * consumer to die right after the commit: the caller must drop the connection without acking. A
 * database that cannot be reached gives "retry".
 */
export class Settler {
  readonly #options: ConsumerOptions;
  readonly #stats: ConsumerStats;
  readonly #batchSize: number;
  readonly #concurrency: number;
  #queue: { d: Delivery; resolve: (v: Verdict) => void }[] = [];
  #running = 0;
  #scheduled = false;

  constructor(options: ConsumerOptions, stats: ConsumerStats) {
    this.#options = options;
    this.#stats = stats;
    this.#batchSize = Math.max(1, options.batchSize ?? 64);
    this.#concurrency = Math.max(1, options.concurrency ?? 4);
    if (options.handler) this.#handler = options.handler;
    else if (options.batchHandler) this.#handler = { batch: options.batchHandler };
    else throw new TypeError("a consumer needs a handler or a batchHandler");
  }

  readonly #handler: InboxHandler | { batch: InboxBatchHandler };

  settle(d: Delivery): Promise<Verdict> {
    deliveryStarted(d);
    return new Promise((resolve) => {
      this.#queue.push({ d, resolve });
      if (!this.#scheduled) {
        this.#scheduled = true;
        // Deliveries read from one socket chunk arrive in one turn: let them gather first.
        setImmediate(() => {
          this.#scheduled = false;
          this.#pump();
        });
      }
    });
  }

  /*
   * A transaction starts at once when none is running (a quiet consumer adds no delay). While one is,
   * another starts only for a full batch; smaller ones wait for the next commit and grow meanwhile, so
   * a busy consumer pays one commit for many messages instead of one each.
   */
  #pump(): void {
    while (
      this.#running < this.#concurrency &&
      this.#queue.length > 0 &&
      (this.#running === 0 || this.#queue.length >= this.#batchSize)
    ) {
      const batch = this.#queue.splice(0, this.#batchSize);
      this.#running++;
      this.#run(batch).finally(() => {
        this.#running--;
        this.#pump();
      });
    }
  }

  async #run(batch: { d: Delivery; resolve: (v: Verdict) => void }[]): Promise<void> {
    let results: InboxResult[];
    try {
      results = await this.#options.inbox.processBatch(
        batch.map((b) => b.d),
        this.#handler,
      );
    } catch (err) {
      this.#options.onError?.(errorOf(err));
      this.#stats.retried += batch.length;
      for (const b of batch) {
        deliveryEnded(b.d, "retry", err);
        b.resolve("retry");
      }
      return;
    }
    batch.forEach((b, i) => {
      b.resolve(verdictOf(this.#options, this.#stats, b.d, results[i]!));
    });
  }
}

/** Counts concurrent work and lets `stop()` wait for it. */
export class InFlight {
  #count = 0;
  #idle: (() => void)[] = [];
  get count(): number {
    return this.#count;
  }
  enter(): void {
    this.#count++;
  }
  leave(): void {
    if (--this.#count === 0) for (const f of this.#idle.splice(0)) f();
  }
  drained(): Promise<void> {
    return this.#count === 0 ? Promise.resolve() : new Promise((r) => this.#idle.push(r));
  }
}
