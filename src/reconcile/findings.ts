/**
 * The findings as recorded (`<schema>.reconcile_findings`, sql/0016): each difference once, under its
 * stable id, with what was done about it. Times are the database's.
 */
import type { Db, Tx } from "../postgres/db.ts";
import type { Finding, FindingKind } from "./compare.ts";

/** Where a finding stands. */
export const FindingState = {
  /** Recorded; nothing was asked for. */
  open: "open",
  /** A person was asked (a review in the console's queue). */
  review: "review",
  /** Its refund began and is not confirmed yet (the next run, or `idem complete`, finishes it). */
  refunding: "refunding",
  /** Refunded at the provider (`refundId`). */
  refunded: "refunded",
  /** A person closed it with an answer (the review's settlement). */
  settled: "settled",
} as const;
/** One of the values of {@link FindingState}. */
export type FindingState = (typeof FindingState)[keyof typeof FindingState];

/** A finding as recorded. */
export interface RecordedFinding extends Finding {
  state: FindingState;
  /** `refund` or `review`, once one was asked for. */
  action: "refund" | "review" | null;
  /** The key the action runs under (the `reconcile` phases runner's). */
  actionScope: string | null;
  actionKey: string | null;
  refundId: string | null;
  foundAt: Date;
  lastSeenAt: Date;
  settledAt: Date | null;
}

interface Row {
  id: string;
  kind: FindingKind;
  scope: string | null;
  reference: string | null;
  charge_id: string | null;
  record_id: string | null;
  amount: string | number;
  currency: string;
  detail: string;
  happened_at: Date | string | null;
  found_at: Date | string;
  last_seen_at: Date | string;
  state: FindingState;
  action: "refund" | "review" | null;
  action_scope: string | null;
  action_key: string | null;
  refund_id: string | null;
  settled_at: Date | string | null;
}

const date = (v: Date | string | null) => (v === null ? null : new Date(v));

function toRecorded(r: Row): RecordedFinding {
  return {
    id: r.id,
    kind: r.kind,
    reference: r.reference,
    scope: r.scope,
    chargeId: r.charge_id,
    recordId: r.record_id,
    amount: Number(r.amount),
    currency: r.currency,
    at: date(r.happened_at) ?? new Date(r.found_at),
    detail: r.detail,
    state: r.state,
    action: r.action,
    actionScope: r.action_scope,
    actionKey: r.action_key,
    refundId: r.refund_id,
    foundAt: new Date(r.found_at),
    lastSeenAt: new Date(r.last_seen_at),
    settledAt: date(r.settled_at),
  };
}

/**
 * Record what a run found: new findings are inserted, known ones only seen again. Returns them all, with
 * `isNew` for those no earlier run had found.
 */
export async function recordFindings(
  db: Db,
  schema: string,
  findings: readonly Finding[],
): Promise<Array<RecordedFinding & { isNew: boolean }>> {
  if (findings.length === 0) return [];
  const { rows } = await db.query<Row & { inserted: boolean }>(
    `INSERT INTO ${schema}.reconcile_findings
       (id, kind, scope, reference, charge_id, record_id, amount, currency, detail, happened_at, found_at,
        last_seen_at, state)
     SELECT f.id, f.kind, f.scope, f.reference, f.charge_id, f.record_id, f.amount, f.currency, f.detail,
            f.happened_at, now(), now(), 'open'
       FROM jsonb_to_recordset($1::text::jsonb) AS f(id text, kind text, scope text, reference text,
            charge_id text, record_id text, amount bigint, currency text, detail text, happened_at timestamptz)
     ON CONFLICT (id) DO UPDATE SET last_seen_at = now()
     RETURNING *, (xmax = 0) AS inserted`,
    [
      JSON.stringify(
        findings.map((f) => ({
          id: f.id,
          kind: f.kind,
          scope: f.scope,
          reference: f.reference,
          charge_id: f.chargeId,
          record_id: f.recordId,
          amount: f.amount,
          currency: f.currency,
          detail: f.detail,
          happened_at: f.at.toISOString(),
        })),
      ),
    ],
  );
  const byId = new Map(rows.map((r) => [r.id, { ...toRecorded(r), isNew: r.inserted === true }]));
  return findings.map((f) => byId.get(f.id)!);
}

/** Recorded findings, oldest first: all, or those in `states` (and, with `acted`, that have an action). */
export async function listFindings(
  db: Db,
  schema: string,
  options: { states?: readonly FindingState[]; acted?: boolean; limit?: number } = {},
): Promise<RecordedFinding[]> {
  const { rows } = await db.query<Row>(
    `SELECT * FROM ${schema}.reconcile_findings
      WHERE ($1::text[] IS NULL OR state = ANY($1::text[])) AND (NOT $3::boolean OR action IS NOT NULL)
      ORDER BY found_at, id LIMIT $2`,
    [
      options.states ? [...options.states] : null,
      Math.max(1, Math.floor(options.limit ?? 10_000)),
      options.acted === true,
    ],
  );
  return rows.map(toRecorded);
}

/** The charges our own compensations refunded: never a difference again. */
export async function refundedCharges(db: Db, schema: string): Promise<Set<string>> {
  const { rows } = await db.query<{ charge_id: string }>(
    `SELECT charge_id FROM ${schema}.reconcile_findings WHERE state = 'refunded' AND charge_id IS NOT NULL`,
  );
  return new Set(rows.map((r) => r.charge_id));
}

/** Name the action a finding gets (once: a finding that has one keeps it). */
export async function assignAction(
  db: Db,
  schema: string,
  id: string,
  action: "refund" | "review",
  key: { scope: string; key: string },
): Promise<RecordedFinding> {
  const { rows } = await db.query<Row>(
    `UPDATE ${schema}.reconcile_findings
        SET action = COALESCE(action, $2), action_scope = COALESCE(action_scope, $3),
            action_key = COALESCE(action_key, $4)
      WHERE id = $1 RETURNING *`,
    [id, action, key.scope, key.key],
  );
  return toRecorded(rows[0]!);
}

/** Move a finding to `state` (in `tx` when it goes with the action's own transaction). */
export async function setFindingState(
  db: Db | Tx,
  schema: string,
  id: string,
  state: FindingState,
  refundId?: string,
): Promise<void> {
  await db.query(
    `UPDATE ${schema}.reconcile_findings
        SET state = $2, refund_id = COALESCE($3, refund_id),
            settled_at = CASE WHEN $2 IN ('refunded', 'settled') THEN COALESCE(settled_at, now()) END
      WHERE id = $1`,
    [id, state, refundId ?? null],
  );
}
