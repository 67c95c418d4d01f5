/**
 * The reconciliation's typed errors: a base class with a stable `code`, and `isReconcileError`, which
 * checks the code (so it works across copies of the package).
 */

/** Stable codes of the reconciliation's errors. */
export const ReconcileErrorCode = {
  /** The mapping (which column is what) is incomplete or wrong. */
  badMapping: "IDEM_RECONCILE_BAD_MAPPING",
  /** The provider's report could not be read with the mapping (a missing column, a bad amount or time). */
  badReport: "IDEM_RECONCILE_BAD_REPORT",
  /** The service's records could not be read (the records query returned other columns). */
  badRecords: "IDEM_RECONCILE_BAD_RECORDS",
} as const;
/** One of the values of {@link ReconcileErrorCode}. */
export type ReconcileErrorCode = (typeof ReconcileErrorCode)[keyof typeof ReconcileErrorCode];

/** What reconciliation throws for input it cannot use. Nothing was recorded or refunded. */
export class ReconcileError extends Error {
  /** Always `"ReconcileError"`: the name logs and stack traces show. */
  override name = "ReconcileError";
  /** A stable code ({@link ReconcileErrorCode}). */
  readonly code: ReconcileErrorCode;
  constructor(code: ReconcileErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
  }
}

/** Whether `e` is a {@link ReconcileError} (by its code). */
export function isReconcileError(e: unknown): e is ReconcileError {
  const code = (e as { code?: unknown } | null)?.code;
  return typeof code === "string" && Object.values(ReconcileErrorCode).includes(code as ReconcileErrorCode);
}
