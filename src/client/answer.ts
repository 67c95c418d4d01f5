/**
 * Classification of one attempt's outcome: what the server said about the operation, and what the
 * client may do next (return the answer, retry with the same key, or stop because nobody knows
 * whether the operation happened). Pure functions of a response or an error, so that each rule can
 * be read and tested on its own; the attempt loop only acts on the verdicts.
 *
 * The fields come from idem's contract (docs/contract.md): problem+json bodies carry
 * `operation_state`, `retry_same_key`, `safe_new_key` and `operation_ref`; the state is also sent as
 * the `Idempotency-Operation-State` header, read when the body has none. Servers that send neither
 * are judged by status alone.
 */

/** Where the operation named by a request stands, as the server reports it. */
export const OperationState = {
  /** Nothing was claimed or run for this request. */
  none: "none",
  /** The key is being worked on (an earlier attempt is still running). */
  inProgress: "in_progress",
  /** The operation finished and its answer was saved. */
  done: "done",
  /** A final business refusal (e.g. a declined card): saved, and known to have had no effect. */
  failedNotApplied: "failed_not_applied",
  /** An external call started and its outcome cannot be established: a person must look. */
  uncertain: "uncertain",
} as const;
/** One of the values of {@link OperationState}. */
export type OperationState = (typeof OperationState)[keyof typeof OperationState];

const STATES: ReadonlySet<string> = new Set(Object.values(OperationState));

export const PROBLEM_PREFIX = "urn:idem:problem:";
/** The only 409 that means "come back later": the key is still being worked on. */
export const IN_FLIGHT_PROBLEM = `${PROBLEM_PREFIX}idempotency-key-in-flight`;
export const UNCERTAIN_PROBLEM = `${PROBLEM_PREFIX}operation-uncertain`;
export const OPERATION_STATE_HEADER = "idempotency-operation-state";
export const ANSWER_WITHIN_HEADER = "idempotency-answer-within";
export const EXPIRES_HEADER = "idempotency-expires";

/** What a response says about the operation (the fields the server sent; absent when it sent none). */
export interface ServerAnswer {
  /** The response status. */
  status: number;
  /** The response headers. */
  headers: Headers;
  /** The problem type (`type` of an application/problem+json body). */
  type?: string;
  /** Where the operation stands (problem body's `operation_state`, or the header). */
  operationState?: OperationState;
  /** Whether retrying the same request with the same key can help. */
  retrySameKey?: boolean;
  /** True only when the server knows the operation had no effect: a new key cannot duplicate it. */
  safeNewKey?: boolean;
  /** Opaque reference of the server's key row, for an operator (`idem keys inspect --ref ...`). */
  operationRef?: string;
}

/** Decides whether an answer that is not a success is retried with the same key. */
export type RetryPredicate = (answer: ServerAnswer) => boolean;

/**
 * The default rule: the server's `retry_same_key` when it sent one; otherwise retry an in-flight key
 * (problem type `idempotency-key-in-flight` or `Idempotency-Operation-State: in_progress`) and the
 * statuses in `statuses` (408, 429, 500, 502, 503, 504 by default). Any other 409 is a final answer.
 */
export function defaultRetryPredicate(statuses: ReadonlySet<number>): RetryPredicate {
  return (answer) => {
    if (answer.retrySameKey !== undefined) return answer.retrySameKey;
    if (isInFlight(answer)) return true;
    return statuses.has(answer.status);
  };
}

/** The server says this key is still being worked on. */
export function isInFlight(answer: ServerAnswer): boolean {
  return answer.type === IN_FLIGHT_PROBLEM || answer.operationState === OperationState.inProgress;
}

/** The server says the outcome cannot be established: never retry it, with either key. */
export function isUncertain(answer: ServerAnswer): boolean {
  return answer.operationState === OperationState.uncertain || answer.type === UNCERTAIN_PROBLEM;
}

/**
 * Read what a non-2xx response says. A problem+json body is read from a clone (the response itself
 * stays unread, to be returned to the caller); other bodies are not read at all.
 */
export async function readAnswer(response: Response): Promise<ServerAnswer> {
  const headers = response.headers;
  const answer: ServerAnswer = { status: response.status, headers };
  const contentType = headers.get("content-type");
  if (contentType !== null && /^application\/problem\+json\b/i.test(contentType)) {
    let problem: unknown;
    try {
      problem = await response.clone().json();
    } catch {
      // Not JSON after all (or cut off): judged by status and headers.
    }
    if (typeof problem === "object" && problem !== null) readProblem(problem as Problem, answer);
  }
  if (answer.operationRef === undefined) {
    const ref = headers.get("idempotency-operation-ref");
    if (ref !== null) answer.operationRef = ref;
  }
  if (answer.operationState === undefined) {
    const state = headers.get(OPERATION_STATE_HEADER)?.trim();
    if (state !== undefined && STATES.has(state)) answer.operationState = state as OperationState;
  }
  return answer;
}

interface Problem {
  type?: unknown;
  operation_state?: unknown;
  retry_same_key?: unknown;
  safe_new_key?: unknown;
  operation_ref?: unknown;
}

function readProblem(p: Problem, into: ServerAnswer): void {
  if (typeof p.type === "string") into.type = p.type;
  if (typeof p.operation_state === "string" && STATES.has(p.operation_state)) {
    into.operationState = p.operation_state as OperationState;
  }
  if (typeof p.retry_same_key === "boolean") into.retrySameKey = p.retry_same_key;
  if (typeof p.safe_new_key === "boolean") into.safeNewKey = p.safe_new_key;
  if (typeof p.operation_ref === "string") into.operationRef = p.operation_ref;
}

/** `Idempotency-Answer-Within` in milliseconds, when present and readable. */
export function answerWithinMs(headers: Headers): number | undefined {
  const raw = headers.get(ANSWER_WITHIN_HEADER);
  if (raw === null) return undefined;
  const seconds = Number(raw.trim());
  return Number.isFinite(seconds) && seconds >= 0 ? seconds * 1000 : undefined;
}

/** `Idempotency-Expires` as an ISO timestamp, when present and readable. */
export function expiresAt(headers: Headers): string | undefined {
  const raw = headers.get(EXPIRES_HEADER);
  if (raw === null) return undefined;
  const at = Date.parse(raw);
  return Number.isNaN(at) ? undefined : new Date(at).toISOString();
}

/**
 * How an attempt that got no response failed, as far as the server's health is concerned:
 * - `lost-reply`: the connection was made and the request sent, then the socket closed (undici's
 *   `UND_ERR_SOCKET` with bytes written, `ECONNRESET`, `EPIPE`). The server is reachable; only this
 *   reply was lost. Such failures do not count against the breaker and spend no retry budget, so
 *   that many replies lost at once (a proxy restart, a flaky link) are retried rather than cut off.
 * - `unreachable`: anything else (connection refused, DNS, connect timeout, a browser's opaque
 *   `TypeError`): counts as a failure.
 */
export type NetworkFailure = "lost-reply" | "unreachable";

const LOST_REPLY_CODES: ReadonlySet<string> = new Set(["UND_ERR_SOCKET", "ECONNRESET", "EPIPE"]);

export function classifyNetworkError(error: unknown): NetworkFailure {
  const cause = (error as { cause?: { code?: unknown; socket?: { bytesWritten?: unknown } } } | undefined)
    ?.cause;
  const code = cause?.code;
  if (typeof code !== "string" || !LOST_REPLY_CODES.has(code)) return "unreachable";
  const written = cause?.socket?.bytesWritten;
  return typeof written === "number" && written === 0 ? "unreachable" : "lost-reply";
}
