import { type IdemError, KeyInFlightError, RetryableError } from "./errors.ts";
import type { StoredResponse } from "./response.ts";

/** The base of every problem `type` URI; the problem's code is appended. */
export const PROBLEM_TYPE_BASE = "urn:idem:problem:";

export interface ProblemDetails {
  type: string;
  title: string;
  status: number;
  detail?: string;
  [extension: string]: unknown;
}

const TITLES: Record<number, string> = {
  400: "Bad Request",
  401: "Unauthorized",
  404: "Not Found",
  409: "Conflict",
  413: "Content Too Large",
  415: "Unsupported Media Type",
  422: "Unprocessable Content",
  500: "Internal Server Error",
  503: "Service Unavailable",
};

const encoder = new TextEncoder();

/** An RFC 9457 `application/problem+json` response. */
export function problemResponse(
  status: number,
  code: string,
  detail: string,
  extra: { headers?: Array<[string, string]>; fields?: Record<string, unknown> } = {},
): StoredResponse {
  const body: ProblemDetails = {
    type: PROBLEM_TYPE_BASE + code,
    title: TITLES[status] ?? "Error",
    status,
    detail,
    ...extra.fields,
  };
  return {
    status,
    headers: [["content-type", "application/problem+json"], ...(extra.headers ?? [])],
    body: encoder.encode(JSON.stringify(body)),
  };
}

/** The problem response for an idem error (with `Retry-After` where a retry will help). */
export function errorResponse(err: IdemError): StoredResponse {
  const headers: Array<[string, string]> = [];
  if (err instanceof KeyInFlightError || err instanceof RetryableError) {
    headers.push(["retry-after", String(err.retryAfterSeconds)]);
  }
  return problemResponse(err.status, err.code, err.message, { headers });
}
