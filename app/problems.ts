import {
  isConnectFailure,
  isDatabaseUnavailable,
  isIdemError,
  NOTHING_DONE,
  type OperationFields,
  OUTCOME_UNKNOWN_RETRY,
  problemResponse,
  RetryableError,
} from "idem";

/**
 * Answer with an RFC 9457 problem (`application/problem+json`) carrying the contract's next-step fields
 * (`operation_state`, `retry_same_key`, `safe_new_key`) and `Idempotency-Operation-State`. By default a
 * 4xx says nothing was done (refused before anything ran: a new key is safe) and a 5xx that the outcome
 * is unknown (retry with the same key, never a new one); a final business answer passes its own, e.g.
 * `FAILED_NOT_APPLIED`.
 */
export function problem(
  status: number,
  code: string,
  detail: string,
  headers: Array<[string, string]> = [],
  operation: OperationFields = status >= 500 ? OUTCOME_UNKNOWN_RETRY : NOTHING_DONE,
): Response {
  const p = problemResponse(status, code, detail, { headers, operation });
  return new Response(p.body as Uint8Array<ArrayBuffer>, { status: p.status, headers: p.headers });
}

/**
 * The answer for an error that escaped a route when it means "try again" (the database unreachable,
 * restarting, read-only after a failover, out of connections; a partition not made yet): 503 with
 * Retry-After and the contract's next-step fields, never a 500. Undefined for other errors.
 * Nothing can have committed when no connection was had; a connection lost later (even at COMMIT) may
 * have committed a write: then the answer does not promise that a new key is safe.
 */
export function unavailableProblem(err: unknown): Response | undefined {
  let retryAfter = 1;
  let detail = "The database is unavailable; retry with the same key (and the same request).";
  if (isIdemError(err) && err instanceof RetryableError) {
    retryAfter = err.retryAfterSeconds;
    detail = err.message;
  } else if (!isDatabaseUnavailable(err)) return undefined;
  const surelyNothing = isConnectFailure(err) || isIdemError(err);
  const p = problemResponse(503, "database-unavailable", detail, {
    headers: [["retry-after", String(retryAfter)]],
    operation: surelyNothing
      ? { operation_state: "none", retry_same_key: true, safe_new_key: true }
      : { operation_state: "in_progress", retry_same_key: true, safe_new_key: false },
  });
  return new Response(p.body as Uint8Array<ArrayBuffer>, { status: p.status, headers: p.headers });
}
