import { type IdemError, OperationUncertainError, ProblemCode } from "./errors.ts";
import type { StoredResponse } from "./response.ts";

/** The base of every problem `type` URI; the problem's code is appended. */
export const PROBLEM_TYPE_BASE = "urn:idem:problem:";

/** The header that repeats a problem's `operation_state`, for clients that do not parse bodies. */
export const OPERATION_STATE_HEADER = "idempotency-operation-state";

/**
 * Where the operation a request names stands (docs/contract.md): `none` (nothing was done under this
 * request), `in_progress` (a key row exists and is unfinished), `done`, `failed_not_applied` (a final
 * answer that changed nothing, e.g. a declined card), `uncertain` (an external call's outcome is unknown).
 */
export type OperationState = "none" | "in_progress" | "done" | "failed_not_applied" | "uncertain";

/** What every idempotency problem tells the client it may safely do next. Stable field names and values. */
export interface OperationFields {
  /** Where the operation stands (also in the `Idempotency-Operation-State` header). */
  operation_state: OperationState;
  /** Retrying the same request with the same key can help. */
  retry_same_key: boolean;
  /** True only when the server knows nothing was done, so a new key cannot duplicate the operation. */
  safe_new_key: boolean;
  /** The key row an operator can look up (opaque: the store's `refs`), whenever one exists. */
  operation_ref?: string;
}

/** An RFC 9457 problem document: `type`, `title`, `status`, an optional `detail`, and extensions. */
export interface ProblemDetails {
  /** A URI naming the kind of problem: idem's are `urn:idem:problem:<code>` (`PROBLEM_TYPE_BASE`). */
  type: string;
  /** A short summary of the kind of problem, the same for every occurrence (the status's reason phrase). */
  title: string;
  /** The HTTP status code of the answer. */
  status: number;
  /** What happened to this request, for a person. */
  detail?: string;
  /** Extension members, e.g. {@link OperationFields}. */
  [extension: string]: unknown;
}

/** RFC 9110's reason phrases (and 429's, RFC 6585), the `title` of a problem with that status. */
const TITLES: Record<number, string> = {
  400: "Bad Request",
  401: "Unauthorized",
  402: "Payment Required",
  403: "Forbidden",
  404: "Not Found",
  405: "Method Not Allowed",
  406: "Not Acceptable",
  408: "Request Timeout",
  409: "Conflict",
  410: "Gone",
  411: "Length Required",
  412: "Precondition Failed",
  413: "Content Too Large",
  414: "URI Too Long",
  415: "Unsupported Media Type",
  422: "Unprocessable Content",
  428: "Precondition Required",
  429: "Too Many Requests",
  500: "Internal Server Error",
  501: "Not Implemented",
  502: "Bad Gateway",
  503: "Service Unavailable",
  504: "Gateway Timeout",
};

const encoder = new TextEncoder();

/**
 * An RFC 9457 `application/problem+json` response. With `operation`, the body carries the contract's
 * fields and the response the `Idempotency-Operation-State` header.
 */
export function problemResponse(
  status: number,
  code: string,
  detail: string,
  extra: {
    headers?: Array<[string, string]>;
    fields?: Record<string, unknown>;
    operation?: OperationFields;
  } = {},
): StoredResponse {
  const body: ProblemDetails = {
    type: PROBLEM_TYPE_BASE + code,
    title: TITLES[status] ?? "Error",
    status,
    detail,
    ...extra.fields,
    ...extra.operation,
  };
  const headers: Array<[string, string]> = [["content-type", "application/problem+json"]];
  if (extra.operation) headers.push([OPERATION_STATE_HEADER, extra.operation.operation_state]);
  if (extra.headers) headers.push(...extra.headers);
  return { status, headers, body: encoder.encode(JSON.stringify(body)) };
}

/**
 * The fields of a business answer that is final and changed nothing (e.g. 402 card-declined): saved
 * and replayed like any final answer; a new intent with a new key is safe.
 */
export const FAILED_NOT_APPLIED: OperationFields = {
  operation_state: "failed_not_applied",
  retry_same_key: false,
  safe_new_key: true,
};

/** A request refused before anything was claimed or run (a bad body, a bad key, no credentials). */
export const NOTHING_DONE: OperationFields = {
  operation_state: "none",
  retry_same_key: false,
  safe_new_key: true,
};

/** Not processed at all, for a reason that may pass (a region not reachable before the request left). */
export const NOT_PROCESSED_RETRY: OperationFields = {
  operation_state: "none",
  retry_same_key: true,
  safe_new_key: true,
};

/**
 * The request may have done something, and what is unknown here (a server failure, a timeout after the
 * request was sent): retrying with the same key settles it; a new key could do it twice.
 */
export const OUTCOME_UNKNOWN_RETRY: OperationFields = {
  operation_state: "in_progress",
  retry_same_key: true,
  safe_new_key: false,
};

/** Where the key stands when an idem error is answered. */
export interface ErrorContext {
  /** The key row's reference (opaque: the store's `refs`), when the request carried a key. */
  ref?: string;
  /**
   * Whether a key row may exist and be unfinished after this failure (phases mode after its claim).
   * In atomic mode a failure rolls the claim back with the work: nothing exists. Default: false.
   */
  claimed?: boolean;
}

/** The contract's fields for an idem error (docs/contract.md's table), or undefined for other problems. */
export function operationFields(err: IdemError, context: ErrorContext = {}): OperationFields | undefined {
  const none = { operation_state: "none", retry_same_key: false, safe_new_key: true } as const;
  switch (err.code) {
    case ProblemCode.KeyMissing:
    case ProblemCode.KeyInvalid:
    case ProblemCode.InvalidBody:
    case ProblemCode.AmbiguousBody:
    case ProblemCode.BodyTooLarge:
      return none;
    case ProblemCode.KeyMismatch:
      return withRef(none, context.ref);
    case ProblemCode.KeyInFlight:
    case ProblemCode.LeaseLost:
      return withRef(
        { operation_state: "in_progress", retry_same_key: true, safe_new_key: false },
        context.ref,
      );
    case ProblemCode.Retryable:
      return context.claimed
        ? withRef({ operation_state: "in_progress", retry_same_key: true, safe_new_key: false }, context.ref)
        : { operation_state: "none", retry_same_key: true, safe_new_key: true };
    case ProblemCode.StoredValueUnreadable:
    case ProblemCode.OperationUncertain:
      return {
        operation_state: "uncertain",
        retry_same_key: false,
        safe_new_key: false,
        operation_ref: err instanceof OperationUncertainError ? err.operationRef : context.ref,
      };
    default:
      return undefined;
  }
}

function withRef(fields: OperationFields, ref: string | undefined): OperationFields {
  return ref === undefined ? fields : { ...fields, operation_ref: ref };
}

/** The problem response for an idem error, with the contract's fields and `Retry-After` where a retry helps. */
export function errorResponse(err: IdemError, context: ErrorContext = {}): StoredResponse {
  const headers: Array<[string, string]> = [];
  const retryAfter = (err as { retryAfterSeconds?: unknown }).retryAfterSeconds;
  if (typeof retryAfter === "number") headers.push(["retry-after", String(retryAfter)]);
  else if (err.code === ProblemCode.LeaseLost) headers.push(["retry-after", "1"]);
  return problemResponse(err.status, err.code, err.message, {
    headers,
    operation: operationFields(err, context),
  });
}
