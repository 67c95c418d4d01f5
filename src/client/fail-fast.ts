/**
 * Retry at one layer; every other layer fails fast and passes the error up. In a chain (app -> gateway
 * -> service -> database), retries at every layer multiply: 3 attempts at 3 layers are 27 calls to a
 * dead database for one tap. The layers in the middle make ONE attempt (`createClient({ failFast:
 * true })`), and instead of retrying hand their caller what it needs to retry well:
 *
 *   - whether the same key may still succeed (`retry_same_key`), or a new key is safe (`safe_new_key`);
 *   - when to come back (`Retry-After`: the dependency's own, or the breaker's cool-down);
 *   - where the operation stands (`operation_state`, `operation_ref`), when the dependency said.
 *
 * `passUp(error)` turns what the inner client threw into that answer (application/problem+json, in the
 * fields idem's contract and idem's client read), so the outer client's backoff, deadline, budget and
 * breaker decide, once, for the whole chain. Forward the caller's key to the inner call, so that the
 * outer layer's retry meets the same operation downstream.
 */
import { OperationState, PROBLEM_PREFIX, UNCERTAIN_PROBLEM } from "./answer.ts";
import {
  CircuitOpenError,
  ClientErrorCode,
  describe,
  type GiveUpDetails,
  GiveUpError,
  hasCode,
  isGiveUpError,
  isOperationUncertainError,
} from "./errors.ts";
import { retryAfterFrom } from "./retry-after.ts";

/** The problem type of an answer passed up by a layer that failed fast. */
export const PASSED_UP_PROBLEM = `${PROBLEM_PREFIX}dependency-failed`;

/**
 * A client with `failFast` made its one attempt and did not get a final answer: the operation may
 * succeed when the caller's layer retries with the same key. Pass it up with {@link passUp}.
 */
export class FailedFastError extends GiveUpError {
  /** Always `"FailedFastError"`: the name logs and stack traces show. */
  override name = "FailedFastError";
  /** The dependency's `Retry-After`, in milliseconds, when it sent one. */
  readonly retryAfterMs?: number;
  constructor(details: GiveUpDetails & { retryAfterMs?: number }) {
    const last = details.lastResponse ? `HTTP ${details.lastResponse.status}` : describe(details.lastError);
    super(
      ClientErrorCode.failedFast,
      `Failed fast after one attempt (${last}): retry at the outer layer`,
      details,
    );
    if (details.retryAfterMs !== undefined) this.retryAfterMs = details.retryAfterMs;
  }
}

/** Whether `e` is a {@link FailedFastError} (by its code). */
export const isFailedFastError = (e: unknown): e is FailedFastError =>
  hasCode(e, [ClientErrorCode.failedFast]);

/** Options of {@link passUp}. */
export interface PassUpOptions {
  /** The wait asked of the caller when the dependency gave none, in seconds. Default 1. */
  retryAfterSeconds?: number;
  /** The status of a retryable answer. Default 503 (502 when the dependency could not be reached). */
  status?: number;
}

/**
 * The answer a layer that failed fast gives its caller, from what its inner client threw (or any other
 * error): a problem+json `Response` in idem's contract fields, which idem's client reads to retry with
 * the same key after `Retry-After`, or to stop:
 *
 *   - an uncertain operation: 502, `operation_state: uncertain`, `retry_same_key: false` (a person looks);
 *   - anything else: 503 (502 if nothing answered), `retry_same_key: true`, `Retry-After`.
 */
export function passUp(error: unknown, options: PassUpOptions = {}): Response {
  const headers: Record<string, string> = {
    "content-type": "application/problem+json",
    "cache-control": "no-store",
  };
  if (isOperationUncertainError(error)) {
    headers["idempotency-operation-state"] = OperationState.uncertain;
    return problem(502, headers, {
      type: UNCERTAIN_PROBLEM,
      title: "Operation uncertain",
      detail:
        "A service further down cannot establish whether the operation took effect; a person must look.",
      operation_state: OperationState.uncertain,
      retry_same_key: false,
      safe_new_key: false,
      ...(error.operationRef && { operation_ref: error.operationRef }),
    });
  }
  const giveUp = isGiveUpError(error) ? error : undefined;
  const waitMs =
    error instanceof CircuitOpenError
      ? error.retryInMs
      : isFailedFastError(error)
        ? error.retryAfterMs
        : giveUp?.lastResponse
          ? retryAfterFrom(giveUp.lastResponse)
          : undefined;
  const seconds = waitMs !== undefined ? Math.ceil(waitMs / 1000) : (options.retryAfterSeconds ?? 1);
  headers["retry-after"] = String(Math.max(0, seconds));
  const state = giveUp?.operationState;
  if (state) headers["idempotency-operation-state"] = state;
  const reached = giveUp ? giveUp.lastResponse !== undefined : false;
  const status = options.status ?? (reached ? 503 : 502);
  return problem(status, headers, {
    type: PASSED_UP_PROBLEM,
    title: status === 503 ? "Service Unavailable" : "Bad Gateway",
    detail: `A service further down did not answer finally (${
      giveUp?.lastResponse ? `HTTP ${giveUp.lastResponse.status}` : describe(giveUp?.lastError ?? error)
    }); retry with the same key.`,
    retry_same_key: true,
    ...(state && { operation_state: state }),
    ...(giveUp?.safeNewKey && { safe_new_key: true }),
    ...(giveUp?.operationRef && { operation_ref: giveUp.operationRef }),
  });
}

function problem(status: number, headers: Record<string, string>, body: Record<string, unknown>): Response {
  return new Response(JSON.stringify({ ...body, status }), { status, headers });
}
