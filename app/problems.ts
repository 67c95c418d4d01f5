import { NOTHING_DONE, type OperationFields, OUTCOME_UNKNOWN_RETRY, problemResponse } from "idem";

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
