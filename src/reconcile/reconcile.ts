/**
 * One reconciliation run: compare the provider's charges with the service's records for a window,
 * record what differs, and act on it: refund (once, keyed) what the operator allows, ask a person about
 * the rest. A periodic job (`idem reconcile` from cron) runs it; every run also carries on the actions
 * of earlier runs (a refund that crashed half-way, a review a person has settled since).
 *
 *   const report = await reconcile({
 *     store, charges: parseReport(csv, mapping), records: recordsFromSql(db, sql),
 *     from, to, refund: httpRefunder(providerUrl),
 *     autoRefund: { maxAmount: 500 },      // duplicates and orphans up to 5.00 are refunded at once
 *     review: true,                        // everything else goes to the console's queue
 *   });
 */
import { isIdemError, Outcome, outcomeOfError, type StoredResponse } from "../core/index.ts";
import { sha256 } from "../core/sha256.ts";
import { recordAction } from "../postgres/admin/admin-actions.ts";
import type { Db } from "../postgres/db.ts";
import type { PostgresStore } from "../postgres/store.ts";
import { compare, type Finding, FindingKind, type ServiceRecord } from "./compare.ts";
import {
  type ActionInput,
  type ReconcileRunnerOptions,
  type Refunder,
  reconcileRunner,
} from "./compensate.ts";
import { ReconcileError, ReconcileErrorCode } from "./errors.ts";
import {
  assignAction,
  FindingState,
  listFindings,
  type RecordedFinding,
  recordFindings,
  refundedCharges,
  setFindingState,
} from "./findings.ts";
import type { ProviderCharge } from "./report.ts";

/** Options of {@link reconcile}. */
export interface ReconcileOptions {
  /** Where findings and actions are recorded (idem's schema). Required. */
  store: PostgresStore;
  /** The provider's charges (`parseReport`), covering the window and its margin. Required. */
  charges: readonly ProviderCharge[];
  /**
   * The service's records, or a function that reads them for a window (`recordsFromSql`); it is asked
   * for the window widened by `marginMs` on both sides. Required.
   */
  records: readonly ServiceRecord[] | ((window: { from: Date; to: Date }) => Promise<ServiceRecord[]>);
  /** The window's start (inclusive). Required. */
  from: Date;
  /** The window's end (exclusive). Required. */
  to: Date;
  /** How far past the window a charge and its record may lie and still meet. Default: 600,000 (10 min). */
  marginMs?: number;
  /** Makes refunds (`httpRefunder`). Without one, nothing is refunded. */
  refund?: Refunder;
  /**
   * Refund at once, without a person, findings of these kinds up to this amount (minor units, per
   * finding): "accept rare duplicates and reconcile". Default: none (nothing is refunded on its own).
   */
  autoRefund?: { maxAmount: number; kinds?: readonly FindingKind[] };
  /** Open a review for findings not refunded on their own: all (`true`) or these kinds. Default: false. */
  review?: boolean | readonly FindingKind[];
  /** See {@link ReconcileRunnerOptions.afterRefund}. */
  afterRefund?: ReconcileRunnerOptions["afterRefund"];
  /** Recorded as the actor of the run in `admin_actions` (`reconcile.run`). Default: "idem reconcile". */
  by?: string;
}

/** What a run found and did. */
export interface ReconcileReport {
  from: Date;
  to: Date;
  /** Charges and records compared. */
  charges: number;
  records: number;
  /** What this run found (each with its state after the run). */
  findings: RecordedFinding[];
  /** Of those, how many no earlier run had found. */
  newFindings: number;
  /** Findings refunded by this run (including earlier runs' actions it finished). */
  refunded: RecordedFinding[];
  /** Findings waiting for a person. */
  inReview: RecordedFinding[];
  /** Actions that could not finish now (transient): the next run carries on. */
  errors: { finding: string; message: string }[];
}

const DEFAULT_AUTO_KINDS: readonly FindingKind[] = [FindingKind.duplicate, FindingKind.orphan];

/** Run one reconciliation (see the module's notes). */
export async function reconcile(o: ReconcileOptions): Promise<ReconcileReport> {
  if (!(o.from.getTime() < o.to.getTime())) throw new RangeError("reconcile: from must be before to");
  const db = o.store.db;
  const schema = o.store.schema;
  const margin = o.marginMs ?? 600_000;
  const records =
    typeof o.records === "function"
      ? await o.records({ from: new Date(o.from.getTime() - margin), to: new Date(o.to.getTime() + margin) })
      : o.records;
  const compensated = await refundedCharges(db, schema);
  let found = compare(o.charges, records, { from: o.from, to: o.to, compensated });
  // A charge whose key is still being worked on has no record YET: not a difference (a later run sees).
  const pending = await pendingReferences(
    db,
    schema,
    found.filter((f) => f.kind !== FindingKind.duplicate).map((f) => f.reference),
  );
  found = found.filter((f) => f.kind === FindingKind.duplicate || !f.reference || !pending.has(f.reference));
  const recorded = await recordFindings(db, schema, found);
  const newFindings = recorded.filter((f) => f.isNew).length;

  const runner = reconcileRunner({ store: o.store, refund: o.refund, afterRefund: o.afterRefund });
  const errors: ReconcileReport["errors"] = [];
  const autoKinds = o.autoRefund?.kinds ?? DEFAULT_AUTO_KINDS;
  const reviewed = (k: FindingKind) => (Array.isArray(o.review) ? o.review.includes(k) : o.review === true);
  const byId = new Map<string, RecordedFinding>(recorded.map(({ isNew: _, ...f }) => [f.id, f]));
  // Earlier runs' actions not finished yet come along.
  for (const f of await listFindings(db, schema, {
    states: [FindingState.review, FindingState.refunding, FindingState.open],
    acted: true,
  })) {
    if (!byId.has(f.id)) byId.set(f.id, f);
  }
  for (let f of byId.values()) {
    if (f.state === FindingState.refunded || f.state === FindingState.settled) continue;
    if (!f.action) {
      const refundable =
        o.refund !== undefined &&
        o.autoRefund !== undefined &&
        autoKinds.includes(f.kind) &&
        f.chargeId !== null &&
        f.amount > 0 &&
        f.amount <= o.autoRefund.maxAmount;
      const action = refundable ? "refund" : reviewed(f.kind) ? "review" : undefined;
      if (!action) continue;
      f = await assignAction(db, schema, f.id, action, {
        scope: f.scope ?? "reconcile",
        key: actionKeyOf(f),
      });
    }
    const state = await drive(runner, f, errors);
    if (state !== f.state) await setFindingState(db, schema, f.id, state);
    byId.set(f.id, { ...f, state });
  }
  const now = recorded.map((f) => byId.get(f.id) ?? f);
  const all = [...byId.values()];
  await recordAction(
    db,
    {
      actor: o.by ?? "idem reconcile",
      action: "reconcile.run",
      details: {
        from: o.from.toISOString(),
        to: o.to.toISOString(),
        charges: o.charges.length,
        records: records.length,
        findings: Object.fromEntries(
          Object.values(FindingKind).map((k) => [k, now.filter((f) => f.kind === k).length]),
        ),
        refunded: all.filter((f) => f.state === FindingState.refunded).map((f) => f.id),
        errors: errors.length,
      },
    },
    { schema },
  );
  return {
    from: o.from,
    to: o.to,
    charges: o.charges.length,
    records: records.length,
    findings: now,
    newFindings,
    refunded: all.filter((f) => f.state === FindingState.refunded),
    inReview: all.filter((f) => f.state === FindingState.review),
    errors,
  };
}

/** The action's key: `reconcile:<finding id>` (hashed when too long for a key). */
export function actionKeyOf(f: Pick<Finding, "id">): string {
  const key = `reconcile:${f.id}`;
  return key.length <= 200 ? key : `reconcile:${sha256(f.id).toString("hex")}`;
}

/** Run (or resume, or replay) a finding's action; returns the finding's state after it. */
async function drive(
  runner: ReturnType<typeof reconcileRunner>,
  f: RecordedFinding,
  errors: ReconcileReport["errors"],
): Promise<RecordedFinding["state"]> {
  const input: ActionInput = {
    finding: {
      id: f.id,
      kind: f.kind,
      chargeId: f.chargeId,
      amount: f.amount,
      currency: f.currency,
      detail: f.detail,
    },
    action: f.action!,
    reason: `${f.kind}: ${f.detail}`,
  };
  const claim = {
    scope: f.actionScope!,
    key: f.actionKey!,
    fingerprint: sha256(`${f.actionScope}\n${f.actionKey}`),
  };
  try {
    const outcome = await runner.run(claim, input, { answerWithinMs: Number.POSITIVE_INFINITY });
    return refundOf(outcome.response) ? FindingState.refunded : FindingState.settled;
  } catch (err) {
    if (!isIdemError(err)) throw err;
    switch (outcomeOfError(err)) {
      case Outcome.Uncertain:
        return FindingState.review;
      case Outcome.InFlight:
        return FindingState.refunding;
      case Outcome.Retryable:
        errors.push({ finding: f.id, message: err.message });
        return f.action === "refund" ? FindingState.refunding : f.state;
      default:
        throw err;
    }
  }
}

function refundOf(response: StoredResponse): string | undefined {
  try {
    const body = JSON.parse(new TextDecoder().decode(response.body)) as { refund?: unknown };
    return response.status < 300 && typeof body?.refund === "string" ? body.refund : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The references (`<scope>:<claim id>`, as phases runners send them) whose key is still being worked
 * on: a charge whose payment row a phase has not written yet, or that waits in review.
 */
export async function pendingReferences(
  db: Db,
  schema: string,
  references: readonly (string | null)[],
): Promise<Set<string>> {
  const claims = new Map<string, string>();
  for (const ref of references) {
    const m = ref ? /^(.*):([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$/i.exec(ref) : null;
    if (m) claims.set(m[2]!.toLowerCase(), ref!);
  }
  if (claims.size === 0) return new Set();
  const { rows } = await db.query<{ ref: string }>(
    `SELECT scope || ':' || claim_id::text AS ref FROM ${schema}.keys
      WHERE claim_id = ANY($1::uuid[]) AND NOT marker AND recovery_point <> 'done'`,
    [[...claims.keys()]],
  );
  return new Set(rows.map((r) => r.ref));
}

/**
 * The service's records from a query (`$1`: the window's start, `$2`: its end) returning the columns
 * `reference`, `amount`, `currency`, `at`, and optionally `id`, `scope`, `operation`.
 */
export function recordsFromSql(
  db: Db,
  sql: string,
): (window: { from: Date; to: Date }) => Promise<ServiceRecord[]> {
  return async ({ from, to }) => {
    const { rows } = await db.query<Record<string, unknown>>(sql, [from, to]);
    return rows.map((r, i) => {
      if (typeof r.reference !== "string" || r.amount == null || typeof r.currency !== "string" || !r.at) {
        throw new ReconcileError(
          ReconcileErrorCode.badRecords,
          `the records query's row ${i + 1} lacks reference, amount, currency or at (it has: ${Object.keys(r).join(", ") || "nothing"})`,
        );
      }
      return {
        reference: r.reference,
        amount: Number(r.amount),
        currency: r.currency.toLowerCase(),
        at: new Date(r.at as string),
        id: r.id == null ? null : String(r.id),
        scope: r.scope == null ? null : String(r.scope),
        operation: r.operation == null ? null : String(r.operation),
      };
    });
  };
}
