/**
 * What every broker's consumer shares: options, statistics, and the step from "a delivery arrived" to
 * "tell the broker ack, retry or done" through the inbox.
 */

import { type Inbox, type InboxBatchHandler, type InboxHandler, InboxResult } from "./inbox.ts";
import { deliveryEnded, deliveryStarted } from "./observe.ts";
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

/**
 * A broker's consumer options whose handlers get that broker's deliveries (`KafkaDelivery`,
 * `SqsDelivery`: a Delivery with the broker's own fields).
 */
export interface DeliveryConsumerOptions<M extends Delivery>
  extends Omit<ConsumerOptions, "handler" | "batchHandler"> {
  /** The message's effect, run in the inbox's transaction. Give this or `batchHandler`. */
  handler?: InboxHandler<M>;
  /** The effect of a batch of new messages at once (set-based SQL), instead of `handler`. */
  batchHandler?: InboxBatchHandler<M>;
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

/**
 * What the broker is to be told about one delivery. "dropped": nothing (an ordered settler let go of
 * it before it ran, e.g. on a Kafka partition's revocation): the broker delivers it again.
 */
export type Verdict = "ack" | "retry" | "done-failed" | "crash" | "dropped";

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

interface Entry {
  d: Delivery;
  /** With `keyOf`: the key whose order this delivery keeps (undefined: none). */
  key: string | undefined;
  resolve: (v: Verdict) => void;
}

/**
 * Runs deliveries through the inbox, gathering those that arrive while earlier transactions are busy
 * into batches, and resolves each with what the broker is to be told. "crash" means a test asked the
 * consumer to die right after the commit: the caller must drop the connection without acking. A
 * database that cannot be reached gives "retry".
 *
 * With `keyOf` (brokers that keep an order per key: Kafka partitions, SQS FIFO message groups), a
 * key's deliveries are applied in the order they arrived: a batch takes a key's deliveries only while
 * no earlier one of that key is in another transaction, and a failed one is retried here, after
 * `retryDelayMs`, ahead of the later ones of its key, which wait (other keys go on). It then resolves
 * only once applied, a duplicate or parked; never "retry".
 */
export class Settler {
  readonly #options: ConsumerOptions;
  readonly #stats: ConsumerStats;
  readonly #batchSize: number;
  readonly #concurrency: number;
  readonly #keyOf: ((d: Delivery) => string | undefined) | undefined;
  #queue: Entry[] = [];
  #running = 0;
  #scheduled = false;
  /** With `keyOf`: keys with a delivery in a transaction or waiting for its retry. */
  readonly #held = new Set<string>();
  readonly #retries = new Set<{ timer: NodeJS.Timeout; entries: Entry[] }>();

  constructor(options: ConsumerOptions, stats: ConsumerStats, keyOf?: (d: Delivery) => string | undefined) {
    this.#options = options;
    this.#stats = stats;
    this.#batchSize = Math.max(1, options.batchSize ?? 64);
    this.#concurrency = Math.max(1, options.concurrency ?? 4);
    this.#keyOf = keyOf;
    if (options.handler) this.#handler = options.handler;
    else if (options.batchHandler) this.#handler = { batch: options.batchHandler };
    else throw new TypeError("a consumer needs a handler or a batchHandler");
  }

  readonly #handler: InboxHandler | { batch: InboxBatchHandler };

  /**
   * Let go of every delivery not yet in a transaction (resolved "dropped"), retries waiting included.
   * Transactions under way finish and resolve as usual.
   */
  drop(): void {
    for (const r of this.#retries) {
      clearTimeout(r.timer);
      for (const e of r.entries) this.#dropped(e);
    }
    this.#retries.clear();
    for (const e of this.#queue.splice(0)) this.#dropped(e);
  }

  #dropped(e: Entry): void {
    deliveryEnded(e.d, "dropped");
    e.resolve("dropped");
  }

  settle(d: Delivery): Promise<Verdict> {
    deliveryStarted(d);
    return new Promise((resolve) => {
      this.#queue.push({ d, key: this.#keyOf?.(d), resolve });
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
    while (this.#running < this.#concurrency && this.#queue.length > 0) {
      const batch = this.#next(this.#running === 0);
      if (batch.length === 0) return;
      this.#running++;
      this.#run(batch).finally(() => {
        this.#running--;
        this.#pump();
      });
    }
  }

  /** The next batch to run: the queue's head, or (with `keyOf`) the deliveries whose key is free. */
  #next(idle: boolean): Entry[] {
    if (!this.#keyOf) {
      return idle || this.#queue.length >= this.#batchSize ? this.#queue.splice(0, this.#batchSize) : [];
    }
    const taken: Entry[] = [];
    const waiting = new Set<string>(); // keys with an earlier delivery left in the queue
    for (const e of this.#queue) {
      if (taken.length === this.#batchSize) break;
      if (e.key !== undefined && (this.#held.has(e.key) || waiting.has(e.key))) {
        waiting.add(e.key);
        continue;
      }
      taken.push(e);
    }
    if (taken.length === 0 || (!idle && taken.length < this.#batchSize)) return [];
    const set = new Set(taken);
    this.#queue = this.#queue.filter((e) => !set.has(e));
    for (const e of taken) if (e.key !== undefined) this.#held.add(e.key);
    return taken;
  }

  async #run(batch: Entry[]): Promise<void> {
    let results: InboxResult[];
    try {
      results = await this.#options.inbox.processBatch(
        batch.map((b) => b.d),
        this.#handler,
        this.#keyOf && ((d) => this.#keyOf!(d)),
      );
    } catch (err) {
      this.#options.onError?.(errorOf(err));
      results = batch.map(() => InboxResult.retry);
      for (const b of batch) deliveryEnded(b.d, "retry", err);
      this.#stats.retried += batch.length;
      if (!this.#keyOf) {
        for (const b of batch) b.resolve("retry");
        return;
      }
      return this.#retryLater(batch);
    }
    const again: Entry[] = [];
    batch.forEach((b, i) => {
      const verdict = verdictOf(this.#options, this.#stats, b.d, results[i]!);
      if (verdict === "retry" && this.#keyOf) again.push(b);
      else b.resolve(verdict);
    });
    if (!this.#keyOf) return;
    const kept = new Set(again.map((e) => e.key));
    for (const b of batch) if (b.key !== undefined && !kept.has(b.key)) this.#held.delete(b.key);
    if (again.length > 0) this.#retryLater(again);
  }

  /** With `keyOf`: put `entries` back at the head of the queue after `retryDelayMs`, keys held meanwhile. */
  #retryLater(entries: Entry[]): void {
    const retry = {
      entries,
      timer: setTimeout(() => {
        this.#retries.delete(retry);
        // Its failed attempts are on record: the inbox clears them once it is applied.
        for (const e of entries) e.d.redelivered = true;
        this.#queue.unshift(...entries);
        for (const e of entries) if (e.key !== undefined) this.#held.delete(e.key);
        this.#pump();
      }, this.#options.retryDelayMs ?? 1_000),
    };
    this.#retries.add(retry);
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
