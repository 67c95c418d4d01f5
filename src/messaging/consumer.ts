/**
 * What every broker's consumer shares: options, statistics, and the step from "a delivery arrived" to
 * "tell the broker ack, retry or done" through the inbox.
 */
import { type Inbox, type InboxHandler, InboxResult } from "./inbox.ts";
import { type Delivery, errorOf } from "./types.ts";

/** Points where a test can make a consumer die as a killed process would (no ack, nothing closed cleanly). */
export type ConsumerCrashPoint = "after-commit";

/** Options shared by `consumeAmqp`, `consumeNats` and `MemoryBroker.consume`. */
export interface ConsumerOptions {
  /** The inbox that deduplicates, applies and parks. Its `consumer` name is this consumer's identity. */
  inbox: Inbox;
  /** The message's effect, run in the inbox's transaction. */
  handler: InboxHandler;
  /** Deliveries handled at once (AMQP prefetch, NATS max ack pending per pull). Default 64. */
  prefetch?: number;
  /** After a failed attempt, wait this long before the broker redelivers (where it can wait). Default 1,000 ms. */
  retryDelayMs?: number;
  /** Failures the consumer survived (connection lost, database down, refused messages). Default: none. */
  onError?: (err: Error) => void;
  /** For tests: return true to die at this point: the effect is committed, the ack never sent. */
  crash?: (point: ConsumerCrashPoint, message: Delivery) => boolean;
}

export interface ConsumerStats {
  applied: number;
  duplicates: number;
  retried: number;
  parked: number;
  /** Deliveries refused without processing (no producer message id). */
  refused: number;
}

/** A consumer at work. */
export interface RunningConsumer {
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

/**
 * Run one delivery through the inbox and decide the broker's answer. "crash" means a test asked the
 * consumer to die right after the commit: the caller must drop the connection without acking.
 * A database that cannot be reached gives "retry".
 */
export async function settle(options: ConsumerOptions, stats: ConsumerStats, d: Delivery): Promise<Verdict> {
  let result: InboxResult;
  try {
    result = await options.inbox.process(d, options.handler);
  } catch (err) {
    options.onError?.(errorOf(err));
    stats.retried++;
    return "retry";
  }
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
