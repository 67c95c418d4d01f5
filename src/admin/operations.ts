/**
 * The operations a person supporting the service performs, in one place: the admin API
 * (`adminHandler`), the console page on it, and the CLI (`idem keys`) all call these, so there is one
 * implementation. Every change is recorded in `<schema>.admin_actions` (who, when, what, why): a key's
 * actions in its own database, in the transaction that makes the change; the others in `db`'s.
 */
import type { KeyInspection } from "../core/index.ts";
import { type ConsumerParkedMessage, parkedMessages, unparkMessage } from "../messaging/inbox-admin.ts";
import {
  outboxCounts,
  outboxLag,
  type ParkedEvent,
  parkedEvents,
  requeueParked,
} from "../messaging/outbox-admin.ts";
import { type AdminAction, listActions, recordAction } from "../postgres/admin/admin-actions.ts";
import { type AuditCheck, type AuditResult, audit, builtinChecks } from "../postgres/admin/audit.ts";
import {
  expiringKeys,
  findKey,
  forgetKey,
  type KeyRef,
  type KeyStory,
  keyStory,
  resolveKeyRef,
} from "../postgres/admin/key-admin.ts";
import type { Db } from "../postgres/db.ts";
import { unfinishedKeys } from "../postgres/keys/inspect.ts";
import { type KeyTable, type ShardedKeyTables, tableFor, tablesOf } from "../postgres/keys/table.ts";
import { openReviews, type Review, type Settlement, settleReview } from "../postgres/phases/review.ts";

/** Options of {@link Operations}. */
export interface OperationsOptions {
  /** The store whose keys are looked at (a `PostgresStore` or a `ShardedStore`). */
  store: KeyTable | ShardedKeyTables;
  /** The database of the outbox, the inbox and the actions not about one key. Default: the store's. */
  db?: Db;
  /** idem's schema in `db`. Default: the store's, else `"idem"`. */
  schema?: string;
  /** The audit's checks. Default: the built-in ones (`builtinChecks`) for the store's retention. */
  auditChecks?: AuditCheck[];
}

/** Which keys to list: waiting for a person, unfinished, or about to expire. */
export type KeyListState = "needs_review" | "unfinished" | "expiring";

/** The last recorded run of the audit. */
export interface AuditRun {
  /** When it ran. */
  at: Date;
  /** Who ran it. */
  actor: string;
  /** Each check's result. */
  results: AuditResult[];
}

/**
 * What an operator can do, in one place, for the CLI (`idem keys ...`) and the admin API alike: look
 * keys up and read their story, settle or forget them, requeue parked events, unpark messages, run the
 * audit. Every change is recorded with who made it.
 */
export class Operations {
  /** The store whose keys are looked at. */
  readonly store: KeyTable | ShardedKeyTables;
  /** The database of the outbox, the inbox and the recorded actions. */
  readonly db: Db;
  /** idem's schema in `db`. */
  readonly schema: string;
  readonly #checks: AuditCheck[];

  constructor(options: OperationsOptions) {
    this.store = options.store;
    const first = tablesOf(options.store)[0];
    const db = options.db ?? first?.db;
    if (!db) throw new TypeError("Operations needs a db (the store has no tables)");
    this.db = db;
    this.schema = options.schema ?? first?.schema ?? "idem";
    this.#checks =
      options.auditChecks ?? builtinChecks({ schema: this.schema, retentionMs: options.store.retentionMs });
  }

  // ---- keys ------------------------------------------------------------------------------------------

  /** The live key a scope + key or an `operation_ref` names (undefined: none). */
  findKey(ref: KeyRef): Promise<KeyInspection | undefined> {
    return findKey(this.store, ref);
  }

  /** The key's recorded story: its timeline, reviews and the actions taken on it. */
  keyStory(ref: KeyRef): Promise<KeyStory | undefined> {
    return keyStory(this.store, ref);
  }

  /** Keys waiting for a person (their reviews), unfinished, or expiring within `withinMs` (1 h). */
  async listKeys(
    state: KeyListState,
    options: { limit?: number; withinMs?: number } = {},
  ): Promise<Array<KeyInspection | Review>> {
    if (state === "needs_review") return openReviews(this.store, options);
    if (state === "unfinished") {
      const out: KeyInspection[] = [];
      for (const t of tablesOf(this.store)) out.push(...(await unfinishedKeys(t, options)));
      return out.slice(0, options.limit ?? 100);
    }
    return expiringKeys(this.store, options);
  }

  /**
   * Settle the open review of a key (`settleReview`; the CLI's `idem keys settle`), the action recorded in
   * the same transaction.
   */
  settle(ref: KeyRef, settlement: Settlement, actor: string): Promise<Review> {
    const { scope, key } = resolveKeyRef(this.store, ref);
    return settleReview(this.store, scope, key, settlement, actor, {
      alsoInTx: (tx, review) =>
        recordAction(
          tx,
          {
            actor,
            action: "key.settle",
            scope,
            key,
            reason: settlement.note,
            details: { reviewId: review.id, settlement },
          },
          { schema: tableFor(this.store, scope).schema },
        ),
    });
  }

  /**
   * Forget a key early (`forgetKey`): only when its records show that nothing it did can be repeated
   * (key-forget.ts), or `effectReversed` by a person who reversed its effect; recorded.
   */
  forget(
    ref: KeyRef,
    actor: string,
    reason: string,
    options: { effectReversed?: boolean } = {},
  ): Promise<KeyInspection> {
    return forgetKey(this.store, ref, { actor, reason, effectReversed: options.effectReversed });
  }

  // ---- outbox and inbox ------------------------------------------------------------------------------

  /** The outbox at a glance: counts by state, the relay's lag (seconds), the parked events. */
  async outbox(options: { limit?: number } = {}): Promise<{
    counts: Awaited<ReturnType<typeof outboxCounts>>;
    lagSeconds: number;
    parked: ParkedEvent[];
  }> {
    const o = { schema: this.schema };
    return {
      counts: await outboxCounts(this.db, o),
      lagSeconds: await outboxLag(this.db, o),
      parked: await parkedEvents(this.db, { ...o, limit: options.limit }),
    };
  }

  /** Requeue one parked event (`id`) or every parked event of an aggregate; recorded. Resolves the count. */
  async requeue(
    target: { id: string } | { aggregateId: string },
    actor: string,
    reason?: string,
  ): Promise<number> {
    return this.db.transaction(async (tx) => {
      const n = await requeueParked(tx, {
        schema: this.schema,
        ...("id" in target ? { ids: [target.id] } : { aggregateId: target.aggregateId }),
      });
      await this.#record(tx, {
        actor,
        action: "outbox.requeue",
        target: "id" in target ? `event ${target.id}` : `aggregate ${target.aggregateId}`,
        reason,
        details: { requeued: n },
      });
      return n;
    });
  }

  /** Every consumer's parked messages, oldest first. */
  parkedMessages(options: { consumer?: string; limit?: number } = {}): Promise<ConsumerParkedMessage[]> {
    return parkedMessages(this.db, { ...options, schema: this.schema });
  }

  /** Unpark a consumer's message (its next delivery is processed again); recorded when it was parked. */
  async unpark(consumer: string, messageId: string, actor: string, reason?: string): Promise<boolean> {
    const was = await unparkMessage(this.db, consumer, messageId, { schema: this.schema });
    if (was) {
      await this.#record(this.db, {
        actor,
        action: "inbox.unpark",
        target: `${consumer} ${messageId}`,
        reason,
      });
    }
    return was;
  }

  // ---- the audit and the record -------------------------------------------------------------------------

  /** Run the audit's checks now; the results are recorded (the last run is `lastAudit`). */
  async runAudit(actor: string): Promise<AuditRun> {
    const results = await audit(this.db, this.#checks, { limit: 20 });
    const a = await this.#record(this.db, {
      actor,
      action: "audit.run",
      details: { results },
    });
    return { at: a.at, actor, results };
  }

  /** The last recorded audit run, or undefined when none was recorded. */
  async lastAudit(): Promise<AuditRun | undefined> {
    const [a] = await listActions(this.db, { schema: this.schema, action: "audit.run", limit: 1 });
    if (!a) return undefined;
    return { at: a.at, actor: a.actor, results: (a.details as { results: AuditResult[] }).results };
  }

  /** The recorded actions, newest first (of one key: in its database). */
  async actions(options: { scope?: string; key?: string; limit?: number } = {}): Promise<AdminAction[]> {
    const dbs = new Map<Db, string>([[this.db, this.schema]]);
    for (const t of tablesOf(this.store)) if (!dbs.has(t.db)) dbs.set(t.db, t.schema);
    const all: AdminAction[] = [];
    for (const [db, schema] of dbs) all.push(...(await listActions(db, { ...options, schema })));
    return all.sort((a, b) => b.at.getTime() - a.at.getTime()).slice(0, options.limit ?? 100);
  }

  /**
   * Record a failed admin authentication from `source` (`admin.auth-failed`), or the start of a streak
   * of requests refused for too many of them (`admin.auth-limited`). The actor is `-`: nobody proved who.
   */
  async recordAuthFailure(source: string, path: string, limited: boolean): Promise<void> {
    await this.#record(this.db, {
      actor: "-",
      action: limited ? "admin.auth-limited" : "admin.auth-failed",
      target: source,
      details: { path: path.slice(0, 200) },
    });
  }

  #record(db: Parameters<typeof recordAction>[0], action: Parameters<typeof recordAction>[1]) {
    return recordAction(db, action, { schema: this.schema });
  }
}
