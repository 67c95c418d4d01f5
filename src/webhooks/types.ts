/**
 * The receiver's public types: the event a handler gets, its context (`tx`, `applyIfNewer`), the
 * options, and what became of an event. The receiver itself is in receiver.ts.
 */
import type { Db, Tx } from "../core/db.ts";
import type { VersionedUpsert } from "../messaging/versioned-upsert.ts";
import type { WebhookScheme } from "./scheme.ts";

/** An event that arrived verified, as the handler gets it. */
export interface WebhookEvent<P = unknown> {
  /** The event's id: the same in every delivery (what the inbox deduplicates on). */
  id: string;
  /** The event's type, e.g. `"payment_intent.succeeded"`. */
  type: string;
  /** The body, parsed. */
  payload: P;
  /** The body as received (UTF-8). */
  rawBody: string;
  /** When the sender created the event, when its scheme says (Stripe, Standard Webhooks); else null. */
  createdAt: Date | null;
  /** The scheme's name: `"stripe"`, `"github"`, `"standard"`. */
  scheme: string;
  /** The delivery's headers worth keeping (id, type, timestamp; never the signature). */
  headers: Record<string, string>;
}

/** A versioned upsert whose version defaults to the event's creation time (see `applyIfNewer`). */
export type EventUpsert = Omit<VersionedUpsert, "version"> & { version?: VersionedUpsert["version"] };

/** What the handler gets besides the event. */
export interface WebhookContext {
  /** The inbox's transaction: the effect's writes go here, and commit with the event's mark. */
  tx: Tx;
  /**
   * Write the row only if this event is newer than what it holds (`versionedUpsert` in `tx`): by
   * `version` (the object's version), else by the event's creation time. Resolves whether it wrote.
   * An event whose every upsert was older is recorded "stale": acknowledged, marked, not applied.
   */
  applyIfNewer(upsert: EventUpsert): Promise<boolean>;
  /** Record this event as taken in but not applied (e.g. an older state found by your own check). */
  stale(): void;
}

/** The effect of one event. Throw to roll it back: the sender is answered 500 and retries. */
export type WebhookHandler<P = unknown> = (event: WebhookEvent<P>, ctx: WebhookContext) => Promise<void>;

/** Options of {@link webhookReceiver}. `db`, `scheme` and `handler` are required. */
export interface WebhookReceiverOptions<P = unknown> {
  /** The database of idem's inbox (migrated) and of the handler's effects. */
  db: Db;
  /** How deliveries are signed: `stripeScheme`, `githubScheme`, `standardWebhooksScheme` or your own. */
  scheme: WebhookScheme;
  /** The effect of one event, in the inbox's transaction. */
  handler: WebhookHandler<P>;
  /** The inbox consumer's name: an event is applied once per consumer. Default `webhook:<scheme name>`. */
  consumer?: string;
  /** The schema idem's tables live in. Default `"idem"`. */
  schema?: string;
  /** Failed attempts after which an event is parked. Default 5. */
  maxAttempts?: number;
  /**
   * `"after-effect"`: answer once the effect committed (a failure answers 500 and the sender retries).
   * `"on-receipt"`: verify, store in the outbox, answer 202; a relay applies it later (`publisher()`).
   * Default `"after-effect"`.
   */
  acknowledge?: "after-effect" | "on-receipt";
  /** The largest body read, in bytes (413 beyond). Default 1 MiB. */
  limit?: number;
  /**
   * Most deliveries applied in one transaction: deliveries that arrive while a transaction is busy
   * share the next commit (a quiet endpoint still commits each at once). 1: a transaction each.
   * Default 16. A handler that throws rolls its batch back; the others are then applied one by one.
   */
  batchSize?: number;
  /** Transactions in flight at once (each holds a connection of `db`'s pool). Default 8. */
  concurrency?: number;
  /** The clock signed timestamps are checked against, in ms (for tests). Default `Date.now`. */
  now?: () => number;
  /** Failures: handler errors (with the event), refused deliveries, an unreachable database. Default `console.error` for server-side faults. */
  onError?: (err: Error, event?: WebhookEvent) => void;
}

/** What became of one event. */
export type WebhookOutcome = "applied" | "stale" | "duplicate" | "parked" | "retry";
