import { problemResponse } from "idem";

/** Answer with an RFC 9457 problem (`application/problem+json`). */
export function problem(
  status: number,
  code: string,
  detail: string,
  headers: Array<[string, string]> = [],
): Response {
  const p = problemResponse(status, code, detail, { headers });
  return new Response(p.body as Uint8Array<ArrayBuffer>, { status: p.status, headers: p.headers });
}
