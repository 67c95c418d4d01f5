import { createHash } from "node:crypto";

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

export type BodyKind = "json" | "form" | "raw";

export function bodyKind(contentType: string | null | undefined): BodyKind {
  const ct = (contentType ?? "").split(";")[0]!.trim().toLowerCase();
  if (ct === "application/json" || ct.endsWith("+json")) return "json";
  if (ct === "application/x-www-form-urlencoded") return "form";
  return "raw";
}

const decoder = new TextDecoder("utf-8", { fatal: false });

/** JSON with object keys sorted at every depth, so `{"b":1,"a":2}` and `{"a":2,"b":1}` are equal. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== "object") return JSON.stringify(value) ?? "null";
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  const entries = Object.keys(value as Record<string, unknown>)
    .filter((k) => (value as Record<string, unknown>)[k] !== undefined)
    .sort()
    .map((k) => `${JSON.stringify(k)}:${canonicalJson((value as Record<string, unknown>)[k])}`);
  return `{${entries.join(",")}}`;
}

/** A form body with its pairs sorted (by name, then value) and re-encoded the same way every time. */
export function canonicalForm(body: string): string {
  const pairs = [...new URLSearchParams(body)];
  pairs.sort(([a, av], [b, bv]) => (a < b ? -1 : a > b ? 1 : av < bv ? -1 : av > bv ? 1 : 0));
  return new URLSearchParams(pairs).toString();
}

/** The canonical bytes of a body: sorted JSON, normalised form, or the raw bytes as they came. */
export function canonicalBody(contentType: string | null | undefined, body: Uint8Array): Uint8Array | string {
  if (body.length === 0) return "";
  const kind = bodyKind(contentType);
  if (kind === "json") {
    try {
      return canonicalJson(JSON.parse(decoder.decode(body)));
    } catch {
      return body; // not JSON after all: compare bytes
    }
  }
  if (kind === "form") return canonicalForm(decoder.decode(body));
  return body;
}

function normalisePath(path: string): string {
  const q = path.indexOf("?");
  if (q < 0) return path;
  const params = [...new URLSearchParams(path.slice(q + 1))].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return params.length ? `${path.slice(0, q)}?${new URLSearchParams(params)}` : path.slice(0, q);
}

/**
 * SHA-256 over the method, the path (query parameters sorted) and the canonical body. Two requests with
 * the same fingerprint are the same request; the same key with another fingerprint is answered with 422.
 */
export function fingerprint(input: FingerprintInput): Buffer {
  const h = createHash("sha256");
  h.update(input.method.toUpperCase());
  h.update("\n");
  h.update(normalisePath(input.path));
  h.update("\n");
  const kind = input.body.length === 0 ? "none" : bodyKind(input.contentType);
  h.update(kind);
  h.update("\n");
  h.update(canonicalBody(input.contentType, input.body));
  return h.digest();
}

/**
 * A fingerprint over selected fields of a parsed body (plus method and path), for APIs whose bodies
 * carry parts that may differ between retries (a client timestamp, a trace id).
 */
export function fieldsFingerprint(method: string, path: string, fields: Record<string, unknown>): Buffer {
  return createHash("sha256")
    .update(`${method.toUpperCase()}\n${normalisePath(path)}\nfields\n${canonicalJson(fields)}`)
    .digest();
}

/** Parse a body (JSON or form) into a plain object, for field fingerprints. `undefined` for raw bodies. */
export function parseBody(
  contentType: string | null | undefined,
  body: Uint8Array,
): Record<string, unknown> | undefined {
  const kind = bodyKind(contentType);
  try {
    if (kind === "json") {
      const v = JSON.parse(decoder.decode(body));
      return v !== null && typeof v === "object" && !Array.isArray(v) ? v : undefined;
    }
    if (kind === "form") return Object.fromEntries(new URLSearchParams(decoder.decode(body)));
  } catch {
    return undefined;
  }
  return undefined;
}
