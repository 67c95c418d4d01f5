import type { Context } from "hono";
import { problemResponse } from "idem";

/** Answer with an RFC 9457 problem (`application/problem+json`). */
export function problem(
  c: Context,
  status: number,
  code: string,
  detail: string,
  headers: Array<[string, string]> = [],
): Response {
  const p = problemResponse(status, code, detail, { headers });
  c.res = undefined;
  return new Response(p.body as Uint8Array<ArrayBuffer>, { status: p.status, headers: p.headers });
}
