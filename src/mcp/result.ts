/**
 * A tool call's answer in the lifecycle's terms and back: a `CallToolResult` is saved as a
 * `StoredResponse` (status 200, its JSON as the body, under a media type of its own), and whatever the
 * lifecycle answers (the tool's saved result, a phases runner's JSON or problem answer shared with an
 * HTTP route, or idem's own refusals: 409 in progress, 422 other arguments, 400, 401, 503) becomes the
 * `CallToolResult` the client gets, with what idem has to say under `_meta.idempotency`.
 */
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import {
  EXPIRES_HEADER,
  type OperationState,
  Outcome,
  type Settled,
  type StoredResponse,
} from "../core/index.ts";
import { IDEMPOTENCY_META, type IdempotencyMeta, KEY_ARGUMENT, KEY_META } from "./meta.ts";

/** The media type a `CallToolResult` is saved under (what tells it from a route's JSON answer). */
export const TOOL_RESULT_TYPE = "application/vnd.idem.tool-result+json";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/**
 * A `CallToolResult` as a phase's (or the lifecycle's) answer: saved, and replayed as the same result.
 * A phases tool's last phase returns `{ response: toolResponse(result) }`. `_meta.idempotency` is idem's
 * to write and is not saved.
 */
export function toolResponse(result: CallToolResult): StoredResponse {
  let saved: CallToolResult = result;
  if (result._meta && IDEMPOTENCY_META in result._meta) {
    const { [IDEMPOTENCY_META]: _, ...meta } = result._meta;
    saved = { ...result, _meta: meta };
  }
  return {
    status: 200,
    headers: [["content-type", TOOL_RESULT_TYPE]],
    body: encoder.encode(JSON.stringify(saved)),
  };
}

function contentType(r: StoredResponse): string {
  for (const [name, value] of r.headers) if (name.toLowerCase() === "content-type") return value;
  return "";
}
function header(r: StoredResponse, wanted: string): string | undefined {
  for (const [name, value] of r.headers) if (name.toLowerCase() === wanted) return value;
  return undefined;
}
const isJson = (type: string) => /^application\/([\w.+-]*\+)?json\b/i.test(type.trim());

/**
 * The tool's answer from a saved answer: a saved `CallToolResult` as it was; a route's JSON answer
 * (a phases runner shared with an HTTP route) as text plus `structuredContent`; a problem as a tool
 * error whose text is its `detail`.
 */
export function resultOf(r: StoredResponse): CallToolResult {
  const type = contentType(r);
  const text = decoder.decode(r.body);
  if (type === TOOL_RESULT_TYPE) return JSON.parse(text) as CallToolResult;
  const result: CallToolResult = { content: [{ type: "text", text }] };
  if (r.status >= 400) result.isError = true;
  if (isJson(type) && text.length > 0) {
    const value: unknown = JSON.parse(text);
    if (typeof value === "object" && value !== null && !Array.isArray(value)) {
      result.structuredContent = value as Record<string, unknown>;
      const detail = (value as { detail?: unknown }).detail;
      if (r.status >= 400 && typeof detail === "string") result.content = [{ type: "text", text: detail }];
    }
  }
  return result;
}

/** The problem's next-step fields (docs/contract.md), read from a problem+json answer. */
function problemFields(r: StoredResponse): Partial<IdempotencyMeta> & { detail?: string } {
  if (!/problem\+json/i.test(contentType(r))) return {};
  let p: Record<string, unknown>;
  try {
    p = JSON.parse(decoder.decode(r.body)) as Record<string, unknown>;
  } catch {
    return {};
  }
  const out: Partial<IdempotencyMeta> & { detail?: string } = { status: r.status };
  if (typeof p.type === "string") out.code = p.type.replace(/^urn:idem:problem:/, "");
  if (typeof p.detail === "string") out.detail = p.detail;
  if (typeof p.operation_state === "string") out.operationState = p.operation_state as OperationState;
  if (typeof p.retry_same_key === "boolean") out.retrySameKey = p.retry_same_key;
  if (typeof p.safe_new_key === "boolean") out.safeNewKey = p.safe_new_key;
  if (typeof p.operation_ref === "string") out.operationRef = p.operation_ref;
  const after = Number(header(r, "retry-after"));
  if (header(r, "retry-after") !== undefined && Number.isFinite(after)) out.retryAfterSeconds = after;
  return out;
}

/**
 * What idem's refusals say in MCP terms: the HTTP wording names a header, a tool call carries an
 * argument or `_meta` field.
 */
const WORDING: Record<string, string> = {
  "idempotency-key-missing":
    `This tool changes something, so each call needs an idempotency key: a new one (a UUID) for each ` +
    `action you intend, the same one on every retry of that action. Pass it as the "${KEY_ARGUMENT}" ` +
    `argument or as _meta.${KEY_META}.`,
  "idempotency-key-in-flight":
    "A call with this idempotency key is still in progress; call again with the same key and the same arguments later.",
  "idempotency-key-mismatch":
    "This idempotency key was already used for a call with other arguments (or another tool); use a new key for a new action.",
  unauthorized:
    "This call cannot be keyed: the server knows no authenticated client or session to keep the key under.",
};

/** The tool error for one of idem's refusals (or the database away, or a tool that threw). */
export function refusal(r: StoredResponse, key: string | undefined): CallToolResult {
  const { detail, ...fields } = problemFields(r);
  const code = fields.code ?? "";
  let text =
    WORDING[code] ?? (detail ?? "The call failed.").replace(/Idempotency-Key( header)?/g, "idempotency key");
  if (fields.retryAfterSeconds !== undefined && fields.retrySameKey !== false) {
    text += ` Ask again in ${fields.retryAfterSeconds} s.`;
  }
  const meta: IdempotencyMeta = { ...(key !== undefined && { key }), replayed: false, ...fields };
  return { isError: true, content: [{ type: "text", text }], _meta: { [IDEMPOTENCY_META]: meta } };
}

/** The client's answer for a settled keyed call: the tool's result (first run or replay), or a refusal. */
export function settledResult(settled: Settled, key: string): CallToolResult {
  const r = settled.response;
  const { outcome } = settled;
  if (outcome !== Outcome.Executed && outcome !== Outcome.NotSaved && outcome !== Outcome.Replayed) {
    return refusal(r, key);
  }
  const result = resultOf(r);
  const meta: IdempotencyMeta = { key, replayed: settled.replayed };
  const expires = header(r, EXPIRES_HEADER);
  if (expires !== undefined) meta.expiresAt = new Date(expires).toISOString();
  // A problem the tool answered with (a declined card: final; an uncertain call: for a person) keeps
  // its next-step fields, so that an agent knows whether to call again.
  const { detail: _, ...fields } = problemFields(r);
  if (fields.operationState !== undefined) Object.assign(meta, fields);
  result._meta = { ...result._meta, [IDEMPOTENCY_META]: meta };
  return result;
}
