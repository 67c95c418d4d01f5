/**
 * Building blocks of the OpenAPI document (app/openapi.ts): reply helpers and the shared components
 * (parameters, headers, responses, reply schemas). Request bodies come from app/schemas.ts, the same
 * objects the service validates with.
 */
import { IdempotencyKeyValue, IdParam } from "./schemas.ts";

export type Json = Record<string, unknown>;

export const ref = (kind: string, name: string) => ({ $ref: `#/components/${kind}/${name}` });

/** The states of an operation a problem names (CONTRACT: `operation_state`). */
export const OPERATION_STATES = ["none", "in_progress", "done", "failed_not_applied", "uncertain"] as const;

/**
 * Headers a keyed route's problem replies carry (CONTRACT: the state, and the answer bound). Declared
 * on the shared responses that keyed routes use too; unkeyed routes do not send them.
 */
const keyedProblemHeaders = (): Json => ({
  "Idempotency-Operation-State": ref("headers", "Idempotency-Operation-State"),
  "Idempotency-Operation-Ref": ref("headers", "Idempotency-Operation-Ref"),
  "Idempotency-Answer-Within": ref("headers", "Idempotency-Answer-Within"),
});

export function problemReply(
  description: string,
  codes: string[],
  extraHeaders: Json = {},
  keyed = false,
): Json {
  return {
    description: `${description} Problem type: ${codes.map((c) => `\`urn:idem:problem:${c}\``).join(", ")}.`,
    headers: { ...(keyed ? keyedProblemHeaders() : {}), ...extraHeaders },
    content: { "application/problem+json": { schema: ref("schemas", "Problem") } },
  };
}

/** The replies every keyed POST can give besides its own success. */
export function keyedReplies(phases: boolean): Json {
  const replies: Json = {
    "400": ref("responses", "BadRequest"),
    "401": ref("responses", "Unauthorized"),
    "409": ref("responses", phases ? "InFlightOrUncertain" : "InFlight"),
    "413": ref("responses", "BodyTooLarge"),
    "415": ref("responses", "UnsupportedMediaType"),
    "422": ref("responses", "KeyMismatch"),
    "500": ref("responses", "InternalError"),
  };
  if (phases) replies["503"] = ref("responses", "Retryable");
  return replies;
}

export function successWithReplay(description: string, schema: Json, location: boolean): Json {
  const headers: Json = {
    "Idempotency-Expires": ref("headers", "Idempotency-Expires"),
    "Idempotent-Replayed": ref("headers", "Idempotent-Replayed"),
    "Idempotency-Answer-Within": ref("headers", "Idempotency-Answer-Within"),
    "Idempotency-Operation-Ref": ref("headers", "Idempotency-Operation-Ref"),
  };
  if (location) headers.Location = ref("headers", "Location");
  return {
    description:
      `${description} A retry with the same key and the same request gets this reply again: the same ` +
      "status and body, byte for byte, plus `Idempotent-Replayed: true`.",
    headers,
    content: { "application/json": { schema } },
  };
}

export const auth = [{ bearer: [] }];
export const jsonReply = (description: string, schema: Json, headers?: Json): Json => ({
  description,
  ...(headers ? { headers } : {}),
  content: { "application/json": { schema } },
});
export const jsonBody = (schema: Json, alsoForm = false): Json => ({
  required: true,
  content: {
    "application/json": { schema },
    ...(alsoForm ? { "application/x-www-form-urlencoded": { schema } } : {}),
  },
});
export const pathParam = (name: string, description: string): Json => ({
  name,
  in: "path",
  required: true,
  description,
  schema: { type: IdParam.type, pattern: IdParam.pattern },
});

export function idempotencyKeyParameter(required: boolean, retention: string): Json {
  return {
    name: "Idempotency-Key",
    in: "header",
    required,
    description:
      "One key per intent: create it when the intent begins (a random UUID) and send it on every retry of " +
      "that intent. An RFC 8941 sf-string, quoted on the wire as the IETF draft has it " +
      '(`Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`); a bare token is accepted too and names ' +
      `the same key. The key: ${IdempotencyKeyValue.description}; inside the quotes, \`"\` is sent as ` +
      "`\\\"` and `\\` as `\\\\`. The length limits and the pattern are the key's own; the sf-string's quotes and " +
      `escapes come on top. Kept for ${retention}; keys are per account.` +
      (required ? " Missing or invalid: 400." : " Optional here; invalid: 400."),
    schema: {
      type: "string",
      minLength: IdempotencyKeyValue.minLength,
      maxLength: IdempotencyKeyValue.maxLength,
      pattern: IdempotencyKeyValue.pattern,
      examples: ['"8e03978e-40d5-43e8-bc93-6894a57f9324"'],
    },
  };
}

export function componentHeaders(retention: string): Json {
  return {
    "Idempotent-Replayed": {
      description:
        "`true` when this reply is a replay of the reply saved under the key (nothing was done again). Absent on a first execution.",
      schema: { type: "string", enum: ["true"] },
    },
    "Idempotency-Expires": {
      description: `When the key is forgotten (HTTP date): ${retention} after the first request. After it, the same key is a new request.`,
      required: true,
      schema: { type: "string" },
    },
    "Idempotency-Operation-State": {
      description:
        "On problem replies of keyed routes: the same `operation_state` as the body, for clients that do " +
        "not read bodies.",
      schema: { type: "string", enum: [...OPERATION_STATES] },
    },
    "Idempotency-Operation-Ref": {
      description:
        "On every answer to a keyed request: the operation's reference (this claim of the key), to ask " +
        "`GET /v1/operations/{ref}` what became of it without sending the request again.",
      schema: { type: "string" },
    },
    "Idempotency-Answer-Within": {
      description:
        "On every reply of a keyed route: the longest (seconds) the server holds a request of this route " +
        "before it answers (`x-idempotency.answerWithinSeconds`). Later attempts should wait at least this " +
        "plus a margin before giving up on a try.",
      schema: { type: "integer", minimum: 0 },
    },
    "Retry-After": {
      description:
        "Seconds to wait before retrying with the same key. Always sent with `503` and with the " +
        "`idempotency-key-in-flight` `409` (the lease's time left); not with `operation-uncertain` (do not " +
        "retry it) nor with `idempotency-lease-lost`, which only the worker that lost its lease sees.",
      schema: { type: "integer", minimum: 1 },
    },
    Location: {
      description: "The created resource.",
      required: true,
      schema: { type: "string" },
    },
    ETag: { description: 'The version, such as `"v3"`.', required: true, schema: { type: "string" } },
  };
}

const retryAfter = { "Retry-After": ref("headers", "Retry-After") };
const inFlight =
  "A request with this key is still being worked on (or, in phases mode, a slow worker lost its lease to a retry): `operation_state: in_progress`. Not saved: retry with the same key after `Retry-After` seconds.";

export const componentResponses: Json = {
  BadRequest: problemReply(
    "The key is missing or invalid, or the body is invalid. Nothing was saved: fix the request and send it again.",
    ["idempotency-key-missing", "idempotency-key-invalid", "invalid-body", "invalid-if-match"],
    {},
    true,
  ),
  Unauthorized: problemReply("Missing or unknown API key. Checked before the key is claimed.", [
    "unauthorized",
  ]),
  InFlight: problemReply(inFlight, ["idempotency-key-in-flight", "idempotency-lease-lost"], retryAfter, true),
  InFlightOrUncertain: problemReply(
    `${inFlight} Or \`operation-uncertain\` (\`operation_state: uncertain\`, no \`Retry-After\`): the ` +
      "provider call started and its outcome cannot be established. Do NOT retry it, with this key or a " +
      "new one: hand `operation_ref` to a person. Any other 409 type is a final answer.",
    ["idempotency-key-in-flight", "idempotency-lease-lost", "operation-uncertain"],
    retryAfter,
    true,
  ),
  KeyMismatch: problemReply(
    "The key was already used for another request (method, path or body differ). Not saved; do not retry: a new request needs a new key.",
    ["idempotency-key-mismatch"],
    {},
    true,
  ),
  BodyTooLarge: problemReply("The body is over 16 KiB.", ["body-too-large"]),
  UnsupportedMediaType: problemReply("The body's Content-Type is not accepted.", ["unsupported-media-type"]),
  NotFound: problemReply("No such resource in your account.", ["not-found"], {}, true),
  InternalError: problemReply(
    "The server failed. Nothing was saved: a retry with the same key is safe.",
    ["internal-error"],
    {},
    true,
  ),
  Retryable: problemReply(
    "A transient failure (the payment provider did not answer, or the database was busy). Not saved and the lease was freed: retry with the same key after `Retry-After`.",
    ["retryable-failure"],
    retryAfter,
    true,
  ),
};

/** The reply schemas (the request schemas are app/schemas.ts's). */
export const replySchemas: Json = {
  Problem: {
    type: "object",
    description:
      "RFC 9457 problem details. Problems about an idempotent operation also say where it stands " +
      "(`operation_state`) and what a client may do (`retry_same_key`, `safe_new_key`): see docs/contract.md.",
    required: ["type", "title", "status"],
    properties: {
      type: { type: "string", description: "Stable: `urn:idem:problem:<code>`." },
      title: { type: "string" },
      status: { type: "integer", minimum: 400, maximum: 599 },
      detail: { type: "string" },
      operation_state: {
        type: "string",
        enum: [...OPERATION_STATES],
        description:
          "Where the operation named by this request stands: `none` (nothing claimed, or this request did " +
          "not run), `in_progress`, `done`, `failed_not_applied` (a final answer; no effect), `uncertain` " +
          "(an external call started; its outcome is unknown: for a person).",
      },
      retry_same_key: {
        type: "boolean",
        description: "Whether sending the same request with the same key again can help.",
      },
      safe_new_key: {
        type: "boolean",
        description:
          "True only when the server knows the operation had no effect, so a new intent (a new key) cannot duplicate it.",
      },
      operation_ref: {
        type: "string",
        description:
          "Opaque reference of the key's row, for an operator (`idem keys inspect --ref ...`). Present whenever a key row exists.",
      },
    },
  },
  Payment: {
    type: "object",
    required: ["id", "amount_cents", "currency", "status", "created_at"],
    properties: {
      id: { type: "string", pattern: "^pay_" },
      amount_cents: { type: "integer" },
      currency: { type: "string" },
      status: { type: "string" },
      created_at: { type: "string", format: "date-time" },
      charge: { type: "string", description: "The provider's charge id (phases mode)." },
    },
  },
  Refund: {
    type: "object",
    required: ["id", "payment_id", "amount_cents", "remaining_cents"],
    properties: {
      id: { type: "string", pattern: "^re_" },
      payment_id: { type: "string" },
      amount_cents: { type: "integer" },
      remaining_cents: { type: "integer" },
    },
  },
  Order: {
    type: "object",
    required: ["id", "amount_cents", "status"],
    properties: {
      id: { type: "string", pattern: "^ord_" },
      amount_cents: { type: "integer" },
      status: { type: "string", enum: ["paid", "shipped"] },
    },
  },
  TopUp: {
    type: "object",
    required: ["id", "wallet_id", "amount_cents", "applied", "balance_cents"],
    properties: {
      id: { type: "string" },
      wallet_id: { type: "string" },
      amount_cents: { type: "integer" },
      applied: { type: "boolean" },
      balance_cents: { type: "integer" },
    },
  },
  Product: {
    type: "object",
    required: ["id", "price_cents", "version"],
    properties: {
      id: { type: "string" },
      price_cents: { type: "integer" },
      version: { type: "integer", minimum: 1 },
    },
  },
};
