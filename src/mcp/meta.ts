/**
 * The names idem gives its fields in MCP messages, in one place for the server wrapper and the agent
 * side (docs/mcp.md lists them):
 *
 *   tools/call request   params._meta.idempotencyKey  the key (or the tool argument `idempotency_key`)
 *   tools/call result    result._meta.idempotency     what idem says about the call ({@link IdempotencyMeta})
 *   tools/list entry     tool._meta.idempotency       how the tool takes its key ({@link ToolIdempotency})
 *
 * Unprefixed, like MCP's own `progressToken`, and named as the HTTP headers are (`Idempotency-Key`).
 */
import type { OperationState } from "../core/index.ts";

/** The request `_meta` field that carries the idempotency key. */
export const KEY_META = "idempotencyKey";
/** The tool argument that carries the key, for clients that cannot set `_meta`. */
export const KEY_ARGUMENT = "idempotency_key";
/** The result `_meta` field (and the tool definition's) that idem writes. */
export const IDEMPOTENCY_META = "idempotency";

/**
 * What idem adds to a keyed tool call's result, under `_meta.idempotency`. On the tool's own answer
 * (first run or replay): `key`, `replayed`, and `expiresAt` once it is saved. On idem's refusals (a
 * call in progress, another call's key, no key, the database away) also the problem's fields.
 */
export interface IdempotencyMeta {
  /** The idempotency key the call carried (absent when it carried none). */
  key?: string;
  /** True when this result is the saved result of an earlier call with the key, sent again. */
  replayed: boolean;
  /** When the server forgets the key (ISO 8601): after it the same key is a new call. */
  expiresAt?: string;
  /** On a refusal: the problem's code, e.g. `idempotency-key-in-flight`, `idempotency-key-mismatch`. */
  code?: string;
  /** On a refusal: the HTTP status the same answer has over HTTP (409, 422, 400, 401, 503...). */
  status?: number;
  /** Where the operation stands (docs/contract.md). */
  operationState?: OperationState;
  /** Calling again with the same key can help. */
  retrySameKey?: boolean;
  /** True only when nothing was done, so a new key cannot duplicate the operation. */
  safeNewKey?: boolean;
  /** When to call again with the same key, in seconds. */
  retryAfterSeconds?: number;
  /** The operation's opaque reference, for an operator (`idem keys inspect --ref`). */
  operationRef?: string;
}

/** How a tool takes its key, published in its `tools/list` entry under `_meta.idempotency`. */
export interface ToolIdempotency {
  /** `required`: every call needs a key; `optional`: a key is used when given (`idempotentHint` tools). */
  key: "required" | "optional";
  /** The `_meta` field read: `idempotencyKey`. */
  meta: string;
  /** The tool argument read, when the tool declares one: `idempotency_key`. */
  argument?: string;
  /** `atomic` (one database transaction) or `phases` (calls to other systems through recovery points). */
  mode: "atomic" | "phases";
}

/** `_meta.idempotency` of a result, when it is there and looks like idem's. */
export function idempotencyMetaOf(result: { _meta?: Record<string, unknown> | undefined } | undefined) {
  const m = result?._meta?.[IDEMPOTENCY_META];
  return typeof m === "object" && m !== null && typeof (m as IdempotencyMeta).replayed === "boolean"
    ? (m as IdempotencyMeta)
    : undefined;
}
