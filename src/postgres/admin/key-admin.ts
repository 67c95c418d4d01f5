/**
 * One key as a person supporting the service needs it (the admin API, the console, `idem keys`): found
 * by the `operation_ref` a customer pastes, its story as the records tell it, the keys about to expire,
 * and forgetting a key early.
 *
 * The story is what the key row, its history, its reviews and the actions table record: the claim (and
 * its claim id), in phases mode every recovery point, lease taken and takeover with their fencing tokens,
 * external call begun, provider lookup and fenced write refused (`key_events`, phases/history.ts), the
 * current lease, the review and its settlement, the saved answer, the expiry. A key with no history
 * (atomic mode, or claimed before sql/0014) shows its row's latest state only.
 */
import { isValidKey, isValidScope, type KeyInspection, refsOf } from "../../core/index.ts";
import { inspectKey } from "../keys/inspect.ts";
import { type KeyTable, liveKeyRow, type ShardedKeyTables, tableFor, tablesOf } from "../keys/table.ts";
import { type KeyEvent, keyEvents } from "../phases/history.ts";
import { type Review, reviewsOf } from "../phases/review.ts";
import { type AdminAction, listActions, recordAction } from "./admin-actions.ts";
import {
  CannotForgetError,
  type ForgetBy,
  type ForgetVerdict,
  forgetFacts,
  forgetVerdict,
} from "./key-forget.ts";

/** A key named by its scope and key, or by the `operation_ref` a client was given. */
export type KeyRef = { scope: string; key: string } | { ref: string };

/**
 * Thrown when an `operation_ref` does not open: not one this service sealed (malformed, altered, made
 * up), or sealed with a secret no longer configured. Answered like an unknown key (404).
 */
export class BadOperationRefError extends Error {
  /** Always `"BadOperationRefError"`: the name logs and stack traces show. */
  override name = "BadOperationRefError";
  constructor() {
    super("no key by that operation_ref: it is not one this service made (or its secret is gone)");
  }
}

/**
 * Thrown when a scope or key given to find a key is one the key rules refuse (empty, too long, NUL or
 * other control characters): nothing is asked of the database. Answered 400.
 */
export class InvalidKeyRefError extends Error {
  /** Always `"InvalidKeyRefError"`: the name logs and stack traces show. */
  override name = "InvalidKeyRefError";
}

/**
 * The scope, key (and claim id, when the ref names one) a `KeyRef` names: a ref opened with the store's
 * secrets (`BadOperationRefError` when it does not open), a scope and key checked against the key rules
 * (`InvalidKeyRefError`), so that nothing they refuse reaches the database.
 */
export function resolveKeyRef(
  store: KeyTable | ShardedKeyTables,
  ref: KeyRef,
): { scope: string; key: string; claimId?: string } {
  if ("ref" in ref) {
    const decoded = refsOf(store).decode(ref.ref.trim());
    if (!decoded) throw new BadOperationRefError();
    return decoded;
  }
  if (!isValidScope(ref.scope)) {
    throw new InvalidKeyRefError("scope must be 1 to 1024 characters, none of them a control character");
  }
  if (!isValidKey(ref.key)) {
    throw new InvalidKeyRefError(
      "key must be 1 to 255 visible ASCII characters (no spaces or control characters)",
    );
  }
  return { scope: ref.scope, key: ref.key };
}

/**
 * The live key a `KeyRef` names, or undefined when there is none (never claimed, expired, or forgotten;
 * or the ref names an earlier claim of a key claimed again since; or the ref does not open).
 */
export async function findKey(
  store: KeyTable | ShardedKeyTables,
  ref: KeyRef,
): Promise<KeyInspection | undefined> {
  let named: { scope: string; key: string; claimId?: string };
  try {
    named = resolveKeyRef(store, ref);
  } catch (err) {
    if (err instanceof BadOperationRefError) return undefined;
    throw err;
  }
  const { scope, key, claimId } = named;
  const found = await inspectKey(tableFor(store, scope), scope, key);
  if (found && claimId && found.claimId && found.claimId !== claimId) return undefined;
  return found;
}

/** One thing that happened to a key, as recorded. */
export interface TimelineEvent {
  /** When; null when the records do not say (e.g. lookups that could not tell). */
  at: Date | null;
  /** What happened. */
  kind:
    | "claimed"
    | "recovery-point"
    | "lease"
    | "lease-taken"
    | "takeover"
    | "lease-released"
    | "lookup"
    | "fencing-refused"
    | "call-begun"
    | "lookups-failed"
    | "review-opened"
    | "review-settled"
    | "answer-saved"
    | "action"
    | "note"
    | "expires";
  /** One line for a person. */
  text: string;
  /** The record's own fields, for tools. */
  details?: unknown;
}

/** Everything recorded about one key: the key itself, what happened to it, its reviews, people's actions. */
export interface KeyStory {
  /** The key as it is now. */
  key: KeyInspection;
  /** What happened to it, oldest first. */
  timeline: TimelineEvent[];
  /** Its reviews, open or settled. */
  reviews: Review[];
  /** What people did to it. */
  actions: AdminAction[];
  /** What the records do not keep, so that nobody reads its absence as "it did not happen". */
  notRecorded: string[];
  /** Whether it may be forgotten now, and why not (key-forget.ts): what the console shows. */
  forget: ForgetVerdict;
}

interface ExtraRow {
  attempted_at: Date | string | null;
  lookup_failures: number | null;
  needs_review_at: Date | string | null;
  lease_live: boolean;
}

/** What a key with no history (atomic mode, or claimed before sql/0014) does not say. */
const NOT_RECORDED = [
  "this key has no recorded history (atomic mode: its claim and saved answer are one transaction; or it was claimed before sql/0014)",
  "earlier recovery points: only the current one is kept (with when it was reached)",
  "earlier leases and takeovers: only the current lease and its fencing token are kept",
  "provider lookups: only the count of those that could not tell is kept",
];
/** What a key's history does not say. */
const NOT_IN_HISTORY = ["lease renewals (heartbeats): only the current lease's expiry is kept"];

/** A recorded event as a timeline entry (the claim is the key row's own entry). */
function fromHistory(e: KeyEvent, k: KeyInspection): TimelineEvent | undefined {
  /** Its details, with the fencing token of the worker that wrote it. */
  const d: Record<string, unknown> = { ...e.details, token: e.token };
  const at = `at recovery point ${String(d.point)}`;
  const token = `fencing token ${e.token}`;
  switch (e.kind) {
    case "claimed":
      return undefined;
    case "recovery-point":
      return {
        at: e.at,
        kind: e.kind,
        text: `reached recovery point ${String(d.point)} (${token})`,
        details: d,
      };
    case "lease-taken":
      return { at: e.at, kind: e.kind, text: `lease taken, free (${token}), ${at}`, details: d };
    case "takeover":
      return {
        at: e.at,
        kind: e.kind,
        text: `lease taken over (${token}) from the expired fencing token ${String(d.replaced)}, ${at}`,
        details: d,
      };
    case "lease-released":
      return { at: e.at, kind: e.kind, text: `lease freed by its holder (${token}), ${at}`, details: d };
    case "call-begun":
      return {
        at: e.at,
        kind: e.kind,
        text: `external call of ${String(d.point)} may begin (${token})`,
        details: d,
      };
    case "lookup": {
      const found =
        d.found === "found"
          ? "found the effect"
          : d.found === "not-found"
            ? "found no effect"
            : "could not tell";
      return {
        at: e.at,
        kind: e.kind,
        text: `provider lookup for ${String(d.point)}: ${found} (${token})`,
        details: d,
      };
    }
    case "fencing-refused":
      return {
        at: e.at,
        kind: e.kind,
        text: `a write by ${token} was refused: its lease had been taken over (it stopped, changing nothing)`,
        details: d,
      };
    case "saved":
      return {
        at: e.at,
        kind: "answer-saved",
        text: `answer saved: ${String(d.status)}${k.saved ? `, ${k.saved.bodyBytes} bytes` : ""} (${token})`,
        details: { ...k.saved, ...d },
      };
    case "note":
      return { at: e.at, kind: "note", text: `${String(d.step)}: ${String(d.text)}`, details: e.details };
    default:
      return { at: e.at, kind: "action", text: `${String(e.kind)} (${token})`, details: d };
  }
}

/** A key's whole recorded story, oldest first; undefined when the key is not live. */
export async function keyStory(
  store: KeyTable | ShardedKeyTables,
  ref: KeyRef,
): Promise<KeyStory | undefined> {
  const k = await findKey(store, ref);
  if (!k) return undefined;
  const table = tableFor(store, k.scope);
  const { rows } = await table.db.query<ExtraRow>(
    `SELECT attempted_at, lookup_failures, needs_review_at,
            lease_until IS NOT NULL AND lease_until > ${table.dbTime.now} AS lease_live ${liveKeyRow(table)}`,
    [k.scope, k.key],
  );
  const extra = rows[0];
  const reviews = (await reviewsOf(table, k.scope, k.key)).filter(
    (r) => Math.abs(r.keyCreatedAt.getTime() - k.createdAt.getTime()) < 1,
  );
  const actions = await listActions(table.db, { schema: table.schema, scope: k.scope, key: k.key });
  const since = (a: AdminAction) => a.at.getTime() >= k.createdAt.getTime() - 1;
  const history = k.claimId ? await keyEvents(table.db, table.schema, { ...k, claimId: k.claimId }) : [];
  // Notes (a flow's steps, key-notes.ts) are not the key's own history: an atomic key may have them.
  const recorded = history.some((e) => e.kind !== "note");
  const first = history.find((e) => e.kind === "claimed");
  const timeline: TimelineEvent[] = [
    {
      at: k.createdAt,
      kind: "claimed",
      text: `claimed${k.claimId ? ` (claim ${k.claimId})` : ""}${k.runner ? ` by runner ${k.runner}` : ""}${first ? ` with a lease (fencing token ${first.token})` : ""}`,
      details: { claimId: k.claimId, fingerprint: k.fingerprint, token: first?.token },
    },
  ];
  for (const e of history) {
    const entry = fromHistory(e, k);
    if (entry) timeline.push(entry);
  }
  if (!recorded && (k.recoveryPoint !== "done" || k.updatedAt)) {
    timeline.push({
      at: k.updatedAt,
      kind: "recovery-point",
      text: `at recovery point ${k.recoveryPoint}`,
      details: { recoveryPoint: k.recoveryPoint, phaseData: k.phaseData },
    });
  }
  if (k.lease) {
    timeline.push({
      at: k.lease.until,
      kind: "lease",
      text: `leased (fencing token ${k.lease.token}) until ${k.lease.until.toISOString()}`,
      details: k.lease,
    });
  }
  if (!recorded && extra?.attempted_at) {
    timeline.push({
      at: new Date(extra.attempted_at),
      kind: "call-begun",
      text: `external call of ${k.recoveryPoint} begun, outcome not recorded yet (looked up before any new call)`,
    });
  }
  if (!recorded && Number(extra?.lookup_failures ?? 0) > 0) {
    timeline.push({
      at: null,
      kind: "lookups-failed",
      text: `${extra!.lookup_failures} provider lookup(s) could not tell whether the call took effect`,
    });
  }
  for (const r of reviews) {
    timeline.push({ at: r.openedAt, kind: "review-opened", text: `sent to review: ${r.reason}` });
    if (r.settledAt) {
      timeline.push({
        at: r.settledAt,
        kind: "review-settled",
        text: `settled by ${r.settledBy}: ${r.settlement?.note ?? ""}`,
        details: r.settlement,
      });
    }
  }
  if (k.saved && !history.some((e) => e.kind === "saved")) {
    timeline.push({
      at: k.updatedAt ?? k.createdAt,
      kind: "answer-saved",
      text: `answer saved: ${k.saved.status}, ${k.saved.bodyBytes} bytes`,
      details: k.saved,
    });
  }
  for (const a of actions.filter(since)) {
    timeline.push({
      at: a.at,
      kind: "action",
      text: `${a.action} by ${a.actor}${a.reason ? `: ${a.reason}` : ""}`,
      details: a.details,
    });
  }
  timeline.push({ at: k.expiresAt, kind: "expires", text: "expires: the same key is then new" });
  const order = (e: TimelineEvent) => (e.kind === "expires" ? Infinity : (e.at?.getTime() ?? Infinity));
  timeline.sort((a, b) => order(a) - order(b));
  const forget = forgetVerdict({
    key: k,
    history,
    leaseLive: extra?.lease_live === true,
    attempted: !!extra?.attempted_at,
    lookupFailures: Number(extra?.lookup_failures ?? 0),
  });
  const notRecorded = recorded ? NOT_IN_HISTORY : NOT_RECORDED;
  return { key: k, timeline, reviews, actions, notRecorded, forget };
}

/** Live keys (any state) that expire within `withinMs` (default one hour), soonest first. */
export async function expiringKeys(
  store: KeyTable | ShardedKeyTables,
  options: { withinMs?: number; limit?: number } = {},
): Promise<KeyInspection[]> {
  const limit = Math.max(1, Math.floor(options.limit ?? 100));
  const within = Math.max(0, Math.floor(options.withinMs ?? 3_600_000));
  const out: KeyInspection[] = [];
  for (const table of tablesOf(store)) {
    const t = table.dbTime;
    const { rows } = await table.db.query<{ scope: string; key: string }>(
      `SELECT scope, key FROM ${table.schema}.keys
        WHERE NOT marker AND bucket >= ${t.oldestBucket} AND created_at > ${t.oldest}
          AND created_at <= ${t.oldest} + $1 * interval '1 millisecond'
        ORDER BY created_at LIMIT $2`,
      [within, limit],
    );
    for (const r of rows) {
      const k = await inspectKey(table, r.scope, r.key);
      if (k) out.push(k);
    }
  }
  return out.sort((a, b) => a.expiresAt.getTime() - b.expiresAt.getTime()).slice(0, limit);
}

/**
 * Forget a key before it expires, so that the same key is new again: only when `forgetVerdict` allows
 * it (or `effectReversed` overrides a refusal that allows it), else `CannotForgetError` saying why.
 * The key's rows are deleted and the action recorded (who, why, what the key was, the verdict) in one
 * transaction. Resolves the forgotten key.
 */
export async function forgetKey(
  store: KeyTable | ShardedKeyTables,
  ref: KeyRef,
  by: ForgetBy,
): Promise<KeyInspection> {
  if (!by.reason?.trim()) throw new CannotForgetError("forgetting a key needs a reason (it is recorded)");
  resolveKeyRef(store, ref); // a ref that does not open, or a scope or key the rules refuse: say so
  const k = await findKey(store, ref);
  if (!k) throw new CannotForgetError("no live key to forget");
  const table = tableFor(store, k.scope);
  const s = table.schema;
  return table.db.transaction(async (tx) => {
    const facts = await forgetFacts(tx, table, k, true);
    if (!facts) throw new CannotForgetError("the key changed meanwhile: look again");
    const verdict = forgetVerdict(facts);
    const override = !verdict.allowed && verdict.overridable && by.effectReversed === true;
    if (!verdict.allowed && !override) {
      const how = verdict.overridable
        ? " (if you reversed its effect, e.g. refunded the charge, forget it saying so: effect_reversed)"
        : "";
      throw new CannotForgetError(`cannot forget the key: ${verdict.why}${how}`, verdict.overridable);
    }
    await tx.query(`DELETE FROM ${s}.keys WHERE scope = $1 AND key = $2`, [k.scope, k.key]);
    await recordAction(
      tx,
      {
        actor: by.actor,
        action: override ? "key.forget.effect-reversed" : "key.forget",
        scope: k.scope,
        key: k.key,
        reason: by.reason.trim(),
        details: {
          claimId: k.claimId,
          state: k.state,
          recoveryPoint: k.recoveryPoint,
          savedStatus: k.saved?.status ?? null,
          createdAt: k.createdAt,
          verdict,
          ...(override && { effectReversed: true }),
        },
      },
      { schema: s },
    );
    return k;
  });
}
