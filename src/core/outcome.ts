import { IdemError, ProblemCode, RetryableError } from "./errors.ts";
import type { StoredResponse } from "./response.ts";

/** How a request ended, for logs and metrics (`onOutcome`). */
export const Outcome = {
  /** The work ran and its answer was saved. */
  Executed: "executed",
  /** The work ran but its answer was not final (a 5xx, a late validation failure): nothing saved. */
  NotSaved: "not_saved",
  /** A saved answer was replayed. */
  Replayed: "replayed",
  /** 409: another request holds the key. */
  InFlight: "in_flight",
  /** 422: the key was used for a different request. */
  Mismatch: "mismatch",
  /** 400/401: no key, an invalid key, an ambiguous body, no scope, or a replay the caller may not see. */
  Invalid: "invalid",
  /** A transient failure (503, the database unavailable) or a lost lease: retry with the same key. */
  Retryable: "retryable",
  /** 409 operation-uncertain: an external call's outcome is unknown; for a person. */
  Uncertain: "uncertain",
  /** No key on a route where it is optional. */
  Unkeyed: "unkeyed",
} as const;
/** One of the outcomes of {@link Outcome}. */
export type Outcome = (typeof Outcome)[keyof typeof Outcome];

/**
 * How a keyed request ends when its claim or work threw `err`: the one mapping from an error to an
 * {@link Outcome}, used by the lifecycle, the telemetry and the reconciliation. Anything that is not
 * idem's own error (the database, the handler), a retryable failure and a lost lease are retryable;
 * an unknown outcome is uncertain; a 409 is a key in flight and a 422 a key used for another request.
 */
export function outcomeOfError(err: unknown): Outcome {
  if (!(err instanceof IdemError) || err instanceof RetryableError) return Outcome.Retryable;
  if (err.code === ProblemCode.LeaseLost) return Outcome.Retryable;
  if (err.code === ProblemCode.OperationUncertain) return Outcome.Uncertain;
  if (err.status === 409) return Outcome.InFlight;
  if (err.status === 422) return Outcome.Mismatch;
  return Outcome.Retryable;
}

/** What `onOutcome` is called with once per request: how it ended, its status, scope and key. */
export interface OutcomeEvent {
  /** How the request ended. */
  outcome: Outcome;
  /** The HTTP status it was answered with. */
  status: number;
  /** The request's scope, when it was read (keyed requests). */
  scope?: string;
  /** The request's idempotency key; absent on a request without one. */
  key?: string;
}

/** What the lifecycle answers a request with, and how it ended. */
export interface Settled {
  response: StoredResponse;
  outcome: Outcome;
  replayed: boolean;
  executed: boolean;
}

export const REPLAYED_HEADER = "idempotent-replayed";
export const EXPIRES_HEADER = "idempotency-expires";
/** The route's answer bound in seconds, on every keyed response (docs/contract.md). */
export const ANSWER_WITHIN_HEADER = "idempotency-answer-within";
