import { createHash } from "node:crypto";
import { canonicalBytes, canonicalJson, type RequestBody, readRequestBody } from "./body.ts";
import { sha256 } from "./sha256.ts";

/** What the fingerprint is computed from: the parts of a request that make it "the same request". */
export interface FingerprintInput {
  method: string;
  /** The path, with the query string if any (`/v1/payments?expand=x`). */
  path: string;
  /** The `Content-Type` header, if any. */
  contentType?: string | null;
  /** The raw request body bytes (empty for none). */
  body: Uint8Array;
}

function normalisePath(path: string): string {
  const q = path.indexOf("?");
  // Stryker disable next-line EqualityOperator: equivalent: a request path starts with "/", never "?"
  if (q < 0) return path;
  // Stryker disable next-line EqualityOperator,ConditionalExpression: equivalent: how ties are broken only has to be consistent
  const params = [...new URLSearchParams(path.slice(q + 1))].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return params.length ? `${path.slice(0, q)}?${new URLSearchParams(params)}` : path.slice(0, q);
}

/**
 * SHA-256 over the method, the path (query parameters sorted) and the body as read once
 * (`readRequestBody`): sorted JSON, the form's fields sorted by name, or the raw bytes. Two requests
 * with the same fingerprint are the same request, and their handlers get the same `body` value; the
 * same key with another fingerprint is answered with 422.
 */
export function fingerprintRequest(method: string, path: string, body: RequestBody): Buffer {
  const head = `${method.toUpperCase()}\n${normalisePath(path)}\n${body.kind}\n`;
  const canonical = canonicalBytes(body);
  if (typeof canonical === "string") return sha256(head + canonical);
  // Bytes (possibly large): hashed where they are, not copied behind the head.
  return createHash("sha256").update(head).update(canonical).digest();
}

/**
 * The fingerprint of a request given as bytes (for tests and tools that build claims by hand). A body
 * that `readRequestBody` refuses (ambiguous or not the JSON it claims to be) is hashed as raw bytes.
 */
export function fingerprint(input: FingerprintInput): Buffer {
  let body: RequestBody;
  try {
    body = readRequestBody(input.contentType, input.body);
  } catch {
    body = { kind: "raw", value: input.body, bytes: input.body };
  }
  return fingerprintRequest(input.method, input.path, body);
}

/**
 * A fingerprint over selected fields of a parsed body (plus method and path), for APIs whose bodies
 * carry parts that may differ between retries (a client timestamp, a trace id).
 */
export function fieldsFingerprint(method: string, path: string, fields: Record<string, unknown>): Buffer {
  return sha256(`${method.toUpperCase()}\n${normalisePath(path)}\nfields\n${canonicalJson(fields)}`);
}
