/**
 * Asking the server what became of an operation, without sending its request again: the server's
 * operation lookup (`GET /v1/operations/{operation_ref}`, or `GET /v1/operations` with the intent's
 * key when no answer ever brought the reference). What a lookup answer means, as pure functions; the
 * client (`client.status()`, `client.resume()`) sends it.
 */
import { type OperationState, PROBLEM_PREFIX } from "./answer.ts";

/** The header every keyed answer of an idem server carries: its operation's reference. */
export const OPERATION_REF_HEADER = "idempotency-operation-ref";
/** Where an idem server's lookup is mounted by default (resolved against the request's origin). */
export const DEFAULT_OPERATIONS_PATH = "/v1/operations";
/** The lookup's own 404: the server keeps nothing under this reference or key for the caller. */
export const OPERATION_NOT_FOUND = `${PROBLEM_PREFIX}operation-not-found`;

/** What the server said about an intent's operation (`client.status(intent)`). */
export interface OperationStatus {
  /**
   * Where the operation stands: the server's `operation_state` (`done`, `failed_not_applied`,
   * `in_progress`, `uncertain`); `unknown` when the server keeps nothing under the intent's key (never
   * claimed, expired, or its work not committed yet: resending with the key is then what settles it);
   * undefined when the server gave no lookup answer (it offers none, or refused: see `response`).
   */
  state: OperationState | "unknown" | undefined;
  /** Whether `response` is the operation's saved answer, exactly as a replay gives it. */
  finished: boolean;
  /** The saved answer when `finished`; else the lookup's own response (its body unread). */
  response: Response;
  /** The operation's reference, when the server named it. */
  operationRef?: string;
  /** The URL asked. */
  lookupUrl: string;
}

/** The lookup URL of an operation: by reference when known, else the collection (asked with the key). */
export function lookupUrlOf(
  requestUrl: string,
  operationsPath: string,
  ref: string | undefined,
  waitSeconds?: number,
): string {
  const path = ref ? `${operationsPath.replace(/\/+$/, "")}/${encodeURIComponent(ref)}` : operationsPath;
  const url = new URL(path, requestUrl);
  if (waitSeconds !== undefined && waitSeconds > 0) url.searchParams.set("wait", String(waitSeconds));
  return url.href;
}

const FINAL_STATES: ReadonlySet<string> = new Set(["done", "failed_not_applied"]);
const OPEN_STATES: ReadonlySet<string> = new Set(["in_progress", "uncertain", "done"]);

/** What a lookup's response says (its body is read only for a 404 problem). */
export async function readLookup(response: Response, lookupUrl: string): Promise<OperationStatus> {
  const h = response.headers;
  const ref = h.get(OPERATION_REF_HEADER) ?? undefined;
  const state = h.get("idempotency-operation-state")?.trim();
  const out = (s: OperationStatus["state"], finished: boolean): OperationStatus =>
    ref === undefined
      ? { state: s, finished, response, lookupUrl }
      : { state: s, finished, response, lookupUrl, operationRef: ref };
  if (h.get("idempotent-replayed") === "true" && ref !== undefined) {
    return out(state && FINAL_STATES.has(state) ? (state as OperationState) : "done", true);
  }
  if (response.status === 200 && ref !== undefined && state && OPEN_STATES.has(state)) {
    return out(state as OperationState, false);
  }
  if (response.status === 404 && /^application\/problem\+json\b/i.test(h.get("content-type") ?? "")) {
    try {
      const p = (await response.clone().json()) as { type?: unknown };
      if (p?.type === OPERATION_NOT_FOUND) return out("unknown", false);
    } catch {
      // not the lookup's 404
    }
  }
  return out(undefined, false);
}
