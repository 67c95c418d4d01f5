/**
 * The comparison itself, pure: the provider's charges and the service's records, joined by the
 * downstream idempotency reference (what a phases runner sent as `ctx.idempotencyKey`, `<scope>:<claim
 * id>`), give four kinds of difference:
 *
 *   duplicate        a reference charged more than once (a second charge made behind idem's back, a
 *                    provider without idempotency keys), or one operation (records with the same
 *                    `operation`, e.g. the same key processed in two regions) charged under two references
 *   orphan           a charge with no record: the customer paid, the service knows of no payment
 *   missing          a record the provider never charged
 *   amount-mismatch  the charge and the record disagree on the amount (or the currency)
 *
 * A charge is counted by what it still holds (amount minus refunds): a charge refunded in full is no
 * longer a difference. Only what happened inside the window [from, to) is reported; charges and records
 * just outside it still take part in the join, so that a charge at 23:59:59 and its record at 00:00:01
 * meet. References still being worked on (`pending`: a key not finished yet, whose record may come
 * later) are left for a later run.
 */
import type { ProviderCharge } from "./report.ts";

/** The kinds of difference. */
export const FindingKind = {
  duplicate: "duplicate",
  orphan: "orphan",
  missing: "missing",
  amountMismatch: "amount-mismatch",
} as const;
/** One of the values of {@link FindingKind}. */
export type FindingKind = (typeof FindingKind)[keyof typeof FindingKind];

/** One of the service's records of an effect at the provider (a payment row). */
export interface ServiceRecord {
  /** The downstream reference the provider was given. Required. */
  reference: string;
  /** What the service believes was charged, in minor units. Required. */
  amount: number;
  /** Lower-case currency. Required. */
  currency: string;
  /** When it was recorded. Required. */
  at: Date;
  /** The record's id (a payment id), for people. */
  id?: string | null;
  /** The account. Default: the reference's prefix (before its last `:`). */
  scope?: string | null;
  /**
   * What the caller asked for once (e.g. `<account>:<Idempotency-Key>`): records with the same operation
   * under different references, each charged, are duplicates (one operation, two effects). Default: none.
   */
  operation?: string | null;
}

/** One difference found. */
export interface Finding {
  /** Stable: the same difference found by another run has the same id. */
  id: string;
  kind: FindingKind;
  /** The reference it is about; null for a charge made without one. */
  reference: string | null;
  /** The account, when known. */
  scope: string | null;
  /** The charge to refund (duplicate, orphan, amount-mismatch), when the report names charges. */
  chargeId: string | null;
  /** The service's record (missing, amount-mismatch, duplicate of an operation). */
  recordId: string | null;
  /** The difference in minor units: what a refund would return (missing: the amount never charged). */
  amount: number;
  currency: string;
  /** When the charge (or the record) was made. */
  at: Date;
  /** One line for a person. */
  detail: string;
}

/** Options of {@link compare}. */
export interface CompareOptions {
  /** The window's start (inclusive). Required. */
  from: Date;
  /** The window's end (exclusive). Required. */
  to: Date;
  /** Charges refunded by our own compensations: never differences again. Default: none. */
  compensated?: ReadonlySet<string>;
  /** References whose operation is still in progress: left for a later run. Default: none. */
  pending?: ReadonlySet<string>;
  /**
   * Records of one `operation` further apart than this are two operations (a key reused after its
   * retention). Default: 86,400,000 (24 h, idem's default retention).
   */
  operationWindowMs?: number;
}

/** The scope a downstream reference names: what comes before its last `:`. */
export function scopeOfReference(reference: string): string | null {
  const i = reference.lastIndexOf(":");
  return i > 0 ? reference.slice(0, i) : null;
}

const held = (c: ProviderCharge) => c.amount - c.refunded;

/** Compare the provider's charges with the service's records. Findings oldest first. */
export function compare(
  charges: readonly ProviderCharge[],
  records: readonly ServiceRecord[],
  options: CompareOptions,
): Finding[] {
  const from = options.from.getTime();
  const to = options.to.getTime();
  const inWindow = (d: Date) => d.getTime() >= from && d.getTime() < to;
  const compensated = options.compensated ?? new Set<string>();
  const pending = options.pending ?? new Set<string>();
  const opWindow = options.operationWindowMs ?? 86_400_000;

  const live = charges.filter((c) => c.succeeded && held(c) > 0 && !(c.id && compensated.has(c.id)));
  const byRef = groupBy(live, (c) => c.reference);
  const recordsByRef = groupBy(records, (r) => r.reference);
  const everCharged = new Set(charges.filter((c) => c.succeeded).map((c) => c.reference));
  const out = new Map<string, Finding>();
  const add = (f: Finding) => {
    if (!out.has(f.id)) out.set(f.id, f);
  };
  const chargeFinding = (kind: FindingKind, c: ProviderCharge, detail: string, record?: ServiceRecord) => {
    add({
      id: `${kind}:${c.id ?? `${c.reference}@${c.at.toISOString()}/${c.amount}`}`,
      kind,
      reference: c.reference || null,
      scope: record?.scope ?? (c.reference ? scopeOfReference(c.reference) : null),
      chargeId: c.id,
      recordId: record?.id ?? null,
      amount: held(c),
      currency: c.currency,
      at: c.at,
      detail,
    });
  };

  for (const [reference, list] of byRef) {
    if (reference && pending.has(reference)) continue;
    const recs = reference ? recordsByRef.get(reference) : undefined;
    if (!recs) {
      for (const c of list) {
        if (!inWindow(c.at)) continue;
        const what = reference ? `reference ${reference}` : "no reference";
        chargeFinding(FindingKind.orphan, c, `charge ${c.id ?? `line ${c.line}`} (${what}) has no record`);
      }
      continue;
    }
    const record = recs[0]!;
    const [first, ...extra] = list;
    for (const c of extra) {
      if (!inWindow(c.at)) continue;
      chargeFinding(
        FindingKind.duplicate,
        c,
        `reference ${reference} was charged again: ${c.id ?? `line ${c.line}`} after ${first!.id ?? `line ${first!.line}`}`,
        record,
      );
    }
    if (inWindow(record.at) && (held(first!) !== record.amount || first!.currency !== record.currency)) {
      add({
        id: `${FindingKind.amountMismatch}:${reference}`,
        kind: FindingKind.amountMismatch,
        reference,
        scope: record.scope ?? scopeOfReference(reference),
        chargeId: first!.id,
        recordId: record.id ?? null,
        amount: first!.currency === record.currency ? held(first!) - record.amount : held(first!),
        currency: first!.currency,
        at: first!.at,
        detail: `reference ${reference}: the provider holds ${held(first!)} ${first!.currency}, the record says ${record.amount} ${record.currency}`,
      });
    }
  }

  for (const r of records) {
    if (!inWindow(r.at) || pending.has(r.reference) || byRef.has(r.reference)) continue;
    // Charged, and refunded by our own compensation (a duplicate of its operation): explained.
    if (
      everCharged.has(r.reference) &&
      charges.some((c) => c.reference === r.reference && c.id && compensated.has(c.id))
    )
      continue;
    add({
      id: `${FindingKind.missing}:${r.reference}`,
      kind: FindingKind.missing,
      reference: r.reference,
      scope: r.scope ?? scopeOfReference(r.reference),
      chargeId: null,
      recordId: r.id ?? null,
      amount: r.amount,
      currency: r.currency,
      at: r.at,
      detail: everCharged.has(r.reference)
        ? `record ${r.id ?? r.reference}: its charge was refunded in full at the provider`
        : `record ${r.id ?? r.reference}: the provider has no charge with reference ${r.reference}`,
    });
  }

  // One operation under several references, each charged: every reference after the first is a duplicate.
  for (const ops of groupBy(
    records.filter((r) => r.operation),
    (r) => r.operation!,
  ).values()) {
    const sorted = [...ops].sort((a, b) => a.at.getTime() - b.at.getTime());
    const firstRecord = sorted[0]!;
    for (const r of sorted.slice(1)) {
      if (r.reference === firstRecord.reference || r.at.getTime() - firstRecord.at.getTime() > opWindow)
        continue;
      if (pending.has(r.reference) || !byRef.has(firstRecord.reference)) continue;
      for (const c of byRef.get(r.reference) ?? []) {
        if (!inWindow(c.at)) continue;
        chargeFinding(
          FindingKind.duplicate,
          c,
          `operation ${r.operation} was charged under two references: ${c.id ?? `line ${c.line}`} (${r.reference}) after ${firstRecord.reference}`,
          r,
        );
      }
    }
  }
  return [...out.values()].sort((a, b) => a.at.getTime() - b.at.getTime() || a.id.localeCompare(b.id));
}

function groupBy<T>(items: readonly T[], keyOf: (item: T) => string): Map<string, T[]> {
  const map = new Map<string, T[]>();
  for (const item of items) {
    const k = keyOf(item);
    const list = map.get(k);
    if (list) list.push(item);
    else map.set(k, [item]);
  }
  for (const list of map.values()) list.sort((a, b) => atOf(a) - atOf(b));
  return map;
}

const atOf = (x: unknown) => ((x as { at?: Date }).at ? (x as { at: Date }).at.getTime() : 0);
