/**
 * Keys whose outcome only a person can settle (`needs_review`, sql/0007): an external call to a system
 * without idempotency keys began, and neither its answer nor a lookup can tell whether it took effect.
 *
 * Such a key answers 409 operation-uncertain, the completer leaves it alone, and its review row (in
 * `<schema>.reviews`, outside the partitioned keys table, so no sweep removes it) waits for
 * `idem keys settle`. Settling records who decided what, and either resumes the key at a phase (with
 * the data the person found, e.g. the provider's charge id) or saves a final answer for it.
 */
import {
  openJson,
  openPhaseData,
  phaseDataParam,
  refsOf,
  type StoredResponse,
  sealBytes,
  sealContext,
  sealHeaders,
} from "../../core/index.ts";
import { jsonColumn, type Tx } from "../db.ts";
import type { KeyTable, ShardedKeyTables } from "../keys/table.ts";
import { tableFor, tablesOf } from "../keys/table.ts";
import { fence, type Lease } from "./lease.ts";
import { type PhaseNeeds, resumeProblem } from "./needs.ts";
import { mergePhaseData } from "./sql.ts";

/**
 * Send the key under our lease to review, with what each phase of its runner needs (`needs`, what a
 * settlement is checked against). Returns false when the lease was no longer ours.
 */
export async function markForReview(
  lease: Lease<unknown, unknown>,
  reason: string,
  needs: PhaseNeeds = {},
): Promise<boolean> {
  const s = lease.table.schema;
  const now = lease.table.dbTime.now;
  const { rows } = await lease.table.db.query<{ marked: number }>(
    `WITH marked AS (
       UPDATE ${s}.keys SET needs_review_at = ${now}, lease_token = NULL, lease_until = NULL,
                            updated_at = ${now}
        WHERE scope = $1 AND key = $2 AND bucket = $3 AND NOT marker AND lease_token = $4::uuid
        RETURNING scope, key, created_at, runner, recovery_point, request, phase_data
     ), opened AS (
       INSERT INTO ${s}.reviews (scope, key, key_created_at, runner, recovery_point, request, phase_data,
                                reason, opened_at, phases)
       SELECT scope, key, created_at, runner, recovery_point, request, phase_data, $5, ${now}, $6::text::jsonb
         FROM marked
       ON CONFLICT (scope, key, key_created_at) WHERE settled_at IS NULL DO NOTHING
       RETURNING id
     )
     SELECT (SELECT count(*) FROM marked)::int AS marked, (SELECT count(*) FROM opened)::int AS opened`,
    [...fence(lease), reason, JSON.stringify(needs)],
  );
  return Number(rows[0]?.marked) === 1;
}

/** One review, open or settled. */
export interface Review {
  /** The review's id. */
  id: number;
  /** The key's scope. */
  scope: string;
  /** The idempotency key. */
  key: string;
  /** The key's `operation_ref` (what the client was given). */
  ref: string;
  /** When the key row the review is about was created. */
  keyCreatedAt: Date;
  /** The runner that owns the key (`definePhases`' name). */
  runner: string | null;
  /** The phase whose external call's outcome is unknown. */
  recoveryPoint: string;
  /** The request's stored input, opened. */
  request: unknown;
  /** What the phases had recorded so far, opened. */
  phaseData: Record<string, unknown> | null;
  /** Why the key went to review. */
  reason: string;
  /** When the review was opened. */
  openedAt: Date;
  /** When it was settled; null while open. */
  settledAt: Date | null;
  /** Who settled it. */
  settledBy: string | null;
  /**
   * The phases it may be resumed at, each with what it needs in its data (null for a review opened
   * before sql/0018).
   */
  phases: PhaseNeeds | null;
  /** The decision, with its note. */
  settlement: Settlement | null;
}

/** How a person settles a key. */
export type Settlement =
  /** The effect did happen (or did not, and it is safe to try again): resume at `phase` with `data`. */
  | { resume: string; data?: Record<string, unknown>; note: string }
  /** Close the operation with this final answer (saved and replayed like any other). */
  | { answer: { status: number; body: unknown }; note: string };

interface ReviewRow {
  id: string | number;
  scope: string;
  key: string;
  key_created_at: Date;
  runner: string | null;
  recovery_point: string;
  request: unknown;
  phase_data: Record<string, unknown> | null;
  reason: string;
  opened_at: Date;
  settled_at: Date | null;
  settled_by: string | null;
  settlement: Settlement | null;
  phases?: PhaseNeeds | null;
}

/** A review as read back, its stored input opened (with the table's sealer, when inputs are sealed). */
function toReview(r: ReviewRow, table: Pick<KeyTable, "sealer" | "refs">): Review {
  const sealer = table.sealer;
  return {
    id: Number(r.id),
    scope: r.scope,
    key: r.key,
    ref: refsOf(table).encode(r.scope, r.key),
    keyCreatedAt: new Date(r.key_created_at),
    runner: r.runner,
    recoveryPoint: r.recovery_point,
    request: openJson(sealer, r.request, sealContext(r.scope, r.key, "request")),
    phaseData: r.phase_data === null ? null : openPhaseData(sealer, r.phase_data, r.scope, r.key),
    reason: r.reason,
    openedAt: new Date(r.opened_at),
    settledAt: r.settled_at ? new Date(r.settled_at) : null,
    settledBy: r.settled_by,
    settlement: r.settlement,
    phases: (jsonColumn(r.phases) as PhaseNeeds | null | undefined) ?? null,
  };
}

/** The open reviews (oldest first) of every table of the store. */
export async function openReviews(
  store: KeyTable | ShardedKeyTables,
  options: { limit?: number } = {},
): Promise<Review[]> {
  const out: Review[] = [];
  for (const t of tablesOf(store)) {
    const { rows } = await t.db.query<ReviewRow>(
      `SELECT * FROM ${t.schema}.reviews WHERE settled_at IS NULL ORDER BY opened_at LIMIT $1`,
      [Math.max(1, Math.floor(options.limit ?? 1000))],
    );
    out.push(...rows.map((r) => toReview(r, t)));
  }
  return out.sort((a, b) => a.openedAt.getTime() - b.openedAt.getTime());
}

/** Every review of one key (open or settled), newest first. */
export async function reviewsOf(table: KeyTable, scope: string, key: string): Promise<Review[]> {
  const { rows } = await table.db.query<ReviewRow>(
    `SELECT * FROM ${table.schema}.reviews WHERE scope = $1 AND key = $2 ORDER BY opened_at DESC LIMIT 100`,
    [scope, key],
  );
  return rows.map((r) => toReview(r, table));
}

/** How many keys wait for a person, and how long the oldest has waited (seconds): the gauge's values. */
export async function reviewGauge(
  store: KeyTable | ShardedKeyTables,
): Promise<{ open: number; oldestSeconds: number }> {
  let open = 0;
  let oldestSeconds = 0;
  for (const t of tablesOf(store)) {
    // The age by the database's clock, like the times it is measured from.
    const { rows } = await t.db.query<{ n: number; age: number | null }>(
      `SELECT count(*)::int AS n, extract(epoch FROM ${t.dbTime.now} - min(opened_at))::float8 AS age
         FROM ${t.schema}.reviews WHERE settled_at IS NULL`,
    );
    open += Number(rows[0]?.n ?? 0);
    if (rows[0]?.age != null) oldestSeconds = Math.max(oldestSeconds, Math.round(Number(rows[0].age)));
  }
  return { open, oldestSeconds: open === 0 ? 0 : Math.max(0, oldestSeconds) };
}

/**
 * Thrown by `settleReview` for a settlement the key cannot go on from (a phase its runner does not
 * have, or without what that phase needs, e.g. the charge id for "charged"): nothing was changed.
 */
export class SettlementRefusedError extends Error {
  /** Always `"SettlementRefusedError"`: the name logs and stack traces show. */
  override name = "SettlementRefusedError";
}

/** Thrown by `settleReview` when the key has no open review. */
export class NoOpenReviewError extends Error {
  /** Always `"NoOpenReviewError"`: the name logs and stack traces show. */
  override name = "NoOpenReviewError";
  constructor(scope: string, key: string) {
    super(`the key ${JSON.stringify(key)} of ${JSON.stringify(scope)} has no open review`);
  }
}

/**
 * Settle a key in review: record the decision (who, when, what) and apply it to the key row, in one
 * transaction. `resume` puts the key back at a phase (clearing the record that a call may have begun,
 * so it is not looked up again), from where the next retry or the completer finishes it; `answer` saves
 * a final answer. When the key row is already gone (retention), only the decision is recorded.
 */
export async function settleReview(
  store: KeyTable | ShardedKeyTables,
  scope: string,
  key: string,
  settlement: Settlement,
  by: string,
  options: {
    /** Also done in the settling transaction (e.g. recording the action, `recordAction`). */
    alsoInTx?: (tx: Tx, review: Review) => Promise<unknown>;
  } = {},
): Promise<Review> {
  if (!settlement.note?.trim()) throw new Error("a settlement needs a note (what was found, where)");
  const t = tableFor(store, scope);
  const s = t.schema;
  const now = t.dbTime.now;
  return t.db.transaction(async (tx) => {
    const { rows } = await tx.query<ReviewRow>(
      `SELECT * FROM ${s}.reviews WHERE scope = $1 AND key = $2 AND settled_at IS NULL
        ORDER BY opened_at DESC LIMIT 1 FOR UPDATE`,
      [scope, key],
    );
    const review = rows[0];
    if (!review) throw new NoOpenReviewError(scope, key);
    // The key row the review was opened for: its created_at as the review copied it, in SQL (the
    // database's timestamps have microseconds, which a round trip through a JS Date would lose).
    const row = [scope, key, review.id];
    const where = `scope = $1 AND key = $2 AND NOT marker AND needs_review_at IS NOT NULL
                   AND created_at = (SELECT key_created_at FROM ${s}.reviews WHERE id = $3)`;
    if ("resume" in settlement) {
      const data = { ...openPhaseData(t.sealer, review.phase_data, scope, key), ...settlement.data };
      const why = resumeProblem(toReview(review, t).phases, settlement.resume, data);
      if (why) throw new SettlementRefusedError(`cannot resume the key: ${why}`);
      await tx.query(
        `UPDATE ${s}.keys SET needs_review_at = NULL, attempted_at = NULL, lookup_failures = 0,
                recovery_point = $4, ${mergePhaseData("$5")},
                updated_at = ${now}
          WHERE ${where}`,
        [
          ...row,
          settlement.resume,
          phaseDataParam(
            t.sealer,
            { scope, key },
            openPhaseData(t.sealer, review.phase_data, scope, key),
            settlement.data,
          ),
        ],
      );
    } else {
      const answer: StoredResponse = {
        status: settlement.answer.status,
        headers: [["content-type", "application/json"]],
        body: new TextEncoder().encode(JSON.stringify(settlement.answer.body ?? null)),
      };
      await tx.query(
        `UPDATE ${s}.keys SET needs_review_at = NULL, attempted_at = NULL, recovery_point = 'done',
                status = $4, headers = $5::text::jsonb, body = $6, updated_at = ${now}
          WHERE ${where}`,
        [
          ...row,
          answer.status,
          sealHeaders(t.sealer, answer.headers, scope, key),
          sealBytes(t.sealer, answer.body, sealContext(scope, key, "body")),
        ],
      );
    }
    const { rows: settled } = await tx.query<ReviewRow>(
      `UPDATE ${s}.reviews SET settled_at = ${now}, settled_by = $2, settlement = $3::text::jsonb
        WHERE id = $1 RETURNING *`,
      [review.id, by, JSON.stringify(settlement)],
    );
    const done = toReview(settled[0]!, t);
    await options.alsoInTx?.(tx, done);
    return done;
  });
}

/**
 * The old name of {@link settleReview}.
 * @deprecated Use `settleReview` (same arguments); this alias is removed in the next release.
 */
export const settleKey: typeof settleReview = settleReview;
