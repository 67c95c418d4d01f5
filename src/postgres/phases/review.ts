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
  encodeOperationRef,
  openJson,
  type Sealer,
  type StoredResponse,
  sealBytes,
  sealContext,
} from "../../core/index.ts";
import type { KeyTable, ShardedKeyTables } from "./key-table.ts";
import { tableFor, tablesOf } from "./key-table.ts";
import { fence, type Lease, nowIso } from "./lease.ts";

/** Send the key under our lease to review. Returns false when the lease was no longer ours. */
export async function markForReview(lease: Lease<unknown, unknown>, reason: string): Promise<boolean> {
  const s = lease.table.schema;
  const { rows } = await lease.table.db.query<{ marked: number }>(
    `WITH marked AS (
       UPDATE ${s}.keys SET needs_review_at = $5::timestamptz, lease_token = NULL, lease_until = NULL,
                            updated_at = $5::timestamptz
        WHERE scope = $1 AND key = $2 AND bucket = $3 AND NOT marker AND lease_token = $4::uuid
        RETURNING scope, key, created_at, runner, recovery_point, request, phase_data
     ), opened AS (
       INSERT INTO ${s}.reviews (scope, key, key_created_at, runner, recovery_point, request, phase_data,
                                reason, opened_at)
       SELECT scope, key, created_at, runner, recovery_point, request, phase_data, $6, $5::timestamptz
         FROM marked
       ON CONFLICT (scope, key, key_created_at) WHERE settled_at IS NULL DO NOTHING
       RETURNING id
     )
     SELECT (SELECT count(*) FROM marked)::int AS marked, (SELECT count(*) FROM opened)::int AS opened`,
    [...fence(lease), nowIso(lease.table), reason],
  );
  return Number(rows[0]?.marked) === 1;
}

/** One review, open or settled. */
export interface Review {
  id: number;
  scope: string;
  key: string;
  /** The key's `operation_ref` (what the client was given). */
  ref: string;
  keyCreatedAt: Date;
  runner: string | null;
  /** The phase whose external call's outcome is unknown. */
  recoveryPoint: string;
  request: unknown;
  phaseData: Record<string, unknown> | null;
  reason: string;
  openedAt: Date;
  settledAt: Date | null;
  settledBy: string | null;
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
}

/** A review as read back, its stored input opened (`sealer`: the store's, when inputs are sealed). */
function toReview(r: ReviewRow, sealer: Sealer | undefined): Review {
  return {
    id: Number(r.id),
    scope: r.scope,
    key: r.key,
    ref: encodeOperationRef(r.scope, r.key),
    keyCreatedAt: new Date(r.key_created_at),
    runner: r.runner,
    recoveryPoint: r.recovery_point,
    request: openJson(sealer, r.request, sealContext(r.scope, r.key, "request")),
    phaseData: r.phase_data,
    reason: r.reason,
    openedAt: new Date(r.opened_at),
    settledAt: r.settled_at ? new Date(r.settled_at) : null,
    settledBy: r.settled_by,
    settlement: r.settlement,
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
    out.push(...rows.map((r) => toReview(r, t.sealer)));
  }
  return out.sort((a, b) => a.openedAt.getTime() - b.openedAt.getTime());
}

/** How many keys wait for a person, and how long the oldest has waited (seconds): the gauge's values. */
export async function reviewGauge(
  store: KeyTable | ShardedKeyTables,
): Promise<{ open: number; oldestSeconds: number }> {
  let open = 0;
  let oldest = Number.POSITIVE_INFINITY;
  let now = Date.now();
  for (const t of tablesOf(store)) {
    now = t.clock();
    const { rows } = await t.db.query<{ n: number; oldest: Date | null }>(
      `SELECT count(*)::int AS n, min(opened_at) AS oldest FROM ${t.schema}.reviews WHERE settled_at IS NULL`,
    );
    open += Number(rows[0]?.n ?? 0);
    if (rows[0]?.oldest) oldest = Math.min(oldest, new Date(rows[0].oldest).getTime());
  }
  return { open, oldestSeconds: open === 0 ? 0 : Math.max(0, Math.round((now - oldest) / 1000)) };
}

/** Thrown by `settleKey` when the key has no open review. */
export class NoOpenReviewError extends Error {
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
export async function settleKey(
  store: KeyTable | ShardedKeyTables,
  scope: string,
  key: string,
  settlement: Settlement,
  by: string,
): Promise<Review> {
  if (!settlement.note?.trim()) throw new Error("a settlement needs a note (what was found, where)");
  const t = tableFor(store, scope);
  const s = t.schema;
  const now = nowIso(t);
  return t.db.transaction(async (tx) => {
    const { rows } = await tx.query<ReviewRow>(
      `SELECT * FROM ${s}.reviews WHERE scope = $1 AND key = $2 AND settled_at IS NULL
        ORDER BY opened_at DESC LIMIT 1 FOR UPDATE`,
      [scope, key],
    );
    const review = rows[0];
    if (!review) throw new NoOpenReviewError(scope, key);
    const row = [scope, key, new Date(review.key_created_at).toISOString()];
    const where = `scope = $1 AND key = $2 AND created_at = $3::timestamptz AND NOT marker
                   AND needs_review_at IS NOT NULL`;
    if ("resume" in settlement) {
      await tx.query(
        `UPDATE ${s}.keys SET needs_review_at = NULL, attempted_at = NULL, lookup_failures = 0,
                recovery_point = $4, phase_data = coalesce(phase_data, '{}'::jsonb) || $5::text::jsonb,
                updated_at = $6::timestamptz
          WHERE ${where}`,
        [...row, settlement.resume, JSON.stringify(settlement.data ?? {}), now],
      );
    } else {
      const answer: StoredResponse = {
        status: settlement.answer.status,
        headers: [["content-type", "application/json"]],
        body: new TextEncoder().encode(JSON.stringify(settlement.answer.body ?? null)),
      };
      await tx.query(
        `UPDATE ${s}.keys SET needs_review_at = NULL, attempted_at = NULL, recovery_point = 'done',
                status = $4, headers = $5::text::jsonb, body = $6, updated_at = $7::timestamptz
          WHERE ${where}`,
        [
          ...row,
          answer.status,
          JSON.stringify(answer.headers),
          sealBytes(t.sealer, answer.body, sealContext(scope, key, "body")),
          now,
        ],
      );
    }
    const { rows: settled } = await tx.query<ReviewRow>(
      `UPDATE ${s}.reviews SET settled_at = $2::timestamptz, settled_by = $3, settlement = $4::text::jsonb
        WHERE id = $1 RETURNING *`,
      [review.id, now, by, JSON.stringify(settlement)],
    );
    return toReview(settled[0]!, t.sealer);
  });
}
