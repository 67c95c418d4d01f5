/**
 * The outbox relay's options and counters (see relay.ts for the loop that uses them), and the checks
 * and defaults applied to the options when a relay is made.
 */
import type { Db } from "../core/db.ts";
import type { Listen } from "../postgres/drivers/listen.ts";
import type { Publisher } from "./types.ts";

/** Points where a test can make a relay die as a killed process would: nothing is released or marked. */
export type RelayCrashPoint = "after-claim" | "after-publish";

/** Options of {@link Relay}. Only `db` and `publisher` are required. */
export interface RelayOptions {
  /** The database the outbox is in. */
  db: Db;
  /** Where the events go (`AmqpPublisher`, `NatsPublisher`, `WebhookPublisher`...). */
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
   * they were written: an event goes out once the broker confirmed every older event of its aggregate
   * (a parked one holds the rest back until it is requeued). Aggregates never wait for each other.
   * Events without an aggregate id are unaffected. Default false.
   */
  orderByAggregate?: boolean;
  /** With `orderByAggregate`: a batch in one call, not a confirm per event (see relay-pipeline.ts). */
  pipeline?: boolean;
  /** Only these topics (so one relay can serve RabbitMQ and another webhooks). Default: every topic. */
  topics?: readonly string[];
  /** Failed publishes after which a row is parked with its last error. Default 10. */
  maxAttempts?: number;
  /**
   * Wait before retrying a failed row: `min(capMs, baseMs * 2^(attempts-1))`, jittered to 50-100%; the
   * relay wakes when it ends. Defaults: baseMs 1,000, capMs 300,000 (10 attempts take about 20 minutes
   * before parking). Rows the broker lost rather than refused (it could not be reached, the connection
   * dropped, no ack came in time) count no attempt: they are tried again after 250 ms, 500 ms, then
   * every second while the broker stays away.
   */
  backoff?: { baseMs?: number; capMs?: number };
  /** Wake up on NOTIFY (see `listenWithPg` & co). Default: none, polling only. */
  listen?: Listen;
  /**
   * How often an idle relay looks for work anyway. Default 5,000 ms with `listen`, 500 ms without (and
   * when `listen` fails at `start()`, e.g. through a pooler: `ListenUnavailableError`, or when the
   * outbox has no NOTIFY trigger: `MigrateOptions.outboxNotify`).
   */
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
  /** Batches claimed (with at least one row). */
  batches: number;
  /** Events the broker confirmed. */
  published: number;
  /** Of `published`: confirmed by the broker as already present (NATS's duplicate window). */
  duplicates: number;
  /** Failed publishes (each counts an attempt on its row). */
  failed: number;
  /** Events parked after `maxAttempts` failed publishes. */
  parked: number;
  /** Batches in which the broker could not be reached or lost messages (put back, no attempt counted). */
  unavailable: number;
  /** Published events deleted by retention. */
  deleted: number;
  /** With `pipeline`: events stored after an earlier event of their aggregate was refused. */
  reordered: number;
}

/** The idle poll of a relay that has no LISTEN to wake it. */
export const POLL_WITHOUT_LISTEN_MS = 500;

/** `n`, when it is a positive finite number; a RangeError naming the option otherwise. */
export function positive(n: number, name: string): number {
  if (!(n > 0) || !Number.isFinite(n)) throw new RangeError(`${name} must be a positive number, got ${n}`);
  return n;
}
