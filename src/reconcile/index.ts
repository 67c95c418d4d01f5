/**
 * `idem/reconcile`: compare a provider's charges with your records, record the differences, and refund
 * (once, keyed) or ask a person about each. The command line is `idem reconcile`; docs/reconcile.md.
 */
export {
  type CompareOptions,
  compare,
  type Finding,
  FindingKind,
  type ServiceRecord,
  scopeOfReference,
} from "./compare.ts";
export {
  type ActionData,
  type ActionInput,
  RECONCILE_RUNNER,
  type ReconcileRunnerOptions,
  type Refunder,
  type RefundRequest,
  type RefundResult,
  reconcileRunner,
} from "./compensate.ts";
export { currencyDigits, toMajor, toMinor } from "./currency.ts";
export { isReconcileError, ReconcileError, ReconcileErrorCode } from "./errors.ts";
export { FindingState, listFindings, type RecordedFinding } from "./findings.ts";
export { type HttpRefunderOptions, httpRefunder } from "./http-refunds.ts";
export {
  actionKeyOf,
  pendingReferences,
  type ReconcileOptions,
  type ReconcileReport,
  reconcile,
  recordsFromSql,
} from "./reconcile.ts";
export {
  type ProviderCharge,
  parseMapping,
  parseReport,
  type ReportColumns,
  type ReportMapping,
} from "./report.ts";
