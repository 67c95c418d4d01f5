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
