/**
 * The contract's fields on problem answers (docs/contract.md, issue 18): every idempotency problem
 * tells the client where the operation stands and what it may do next, so that it never has to guess
 * between retrying, waiting, starting over with a new key and calling a person.
 */
export const OPERATION_STATES = ["none", "in_progress", "done", "failed_not_applied", "uncertain"] as const;

const IN_FLIGHT_TYPE = "urn:idem:problem:idempotency-key-in-flight";

/** What the check needs of one answer. */
export interface SeenAnswer {
  status: number;
  contentType?: string | undefined;
  body: string;
}

export function isProblemJson(contentType: string | undefined): boolean {
  return /^application\/problem\+json\s*(;|$)/i.test(contentType ?? "");
}

/** Authentication answers (401, 403, 407): decided before any key is looked at, so not checked. */
const AUTH_STATUSES = new Set([401, 403, 407]);

/**
 * Whether `a` is a problem answer this check looks at: a 4xx/5xx `application/problem+json`, or any
 * 4xx/5xx when `expected` (an answer that can only be an idempotency problem, e.g. to a request sent
 * without its key); never an authentication answer.
 */
export function isCheckedProblem(a: SeenAnswer, expected = false): boolean {
  return a.status >= 400 && !AUTH_STATUSES.has(a.status) && (expected || isProblemJson(a.contentType));
}

/** What is wrong with a problem answer's fields, or undefined when they follow the contract. */
export function problemFieldsError(a: SeenAnswer): string | undefined {
  if (!isProblemJson(a.contentType)) {
    return `answered ${a.status} ${a.contentType ?? "(no content-type)"}, not application/problem+json with operation_state, retry_same_key and safe_new_key`;
  }
  let p: Record<string, unknown>;
  try {
    const parsed: unknown = JSON.parse(a.body);
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed))
      throw new Error("not an object");
    p = parsed as Record<string, unknown>;
  } catch {
    return `answered ${a.status} problem+json whose body is not a JSON object`;
  }
  const wrong: string[] = [];
  const state = p.operation_state;
  if (!(OPERATION_STATES as readonly unknown[]).includes(state)) {
    wrong.push(
      state === undefined
        ? "no operation_state"
        : `operation_state ${JSON.stringify(state)} is not one of ${OPERATION_STATES.join(", ")}`,
    );
  }
  for (const field of ["retry_same_key", "safe_new_key"]) {
    if (typeof p[field] !== "boolean") {
      wrong.push(p[field] === undefined ? `no ${field}` : `${field} is not a boolean`);
    }
  }
  const inFlight = a.status === 409 && (p.type === IN_FLIGHT_TYPE || state === "in_progress");
  if (inFlight && typeof p.retry_same_key === "boolean" && p.retry_same_key !== true) {
    wrong.push("a 409 in flight says retry_same_key false (the client would give up on a busy key)");
  }
  if (wrong.length === 0) return undefined;
  const type = typeof p.type === "string" ? ` ${p.type}` : "";
  return `${a.status}${type}: ${wrong.join(", ")}`;
}
