/**
 * The OpenAPI paths of the operation lookup (app/operations.ts): `GET /v1/operations/{operation_ref}`,
 * and `GET /v1/operations` with the request's `Idempotency-Key` instead of a reference.
 */
import { auth, type Json, jsonReply, pathParam, problemReply, ref } from "./openapi-parts.ts";

const unkeyed = { required: false, retentionSeconds: null, replayHeader: null, answerWithinSeconds: null };

/** What an operation still in progress (or in review) is reported as. */
const operationSchema: Json = {
  type: "object",
  required: ["operation_ref", "operation_state", "created_at", "updated_at", "expires_at"],
  properties: {
    operation_ref: { type: "string", description: "The operation's reference (`op_...`)." },
    operation_state: { type: "string", enum: ["in_progress", "uncertain", "done"] },
    created_at: { type: "string", format: "date-time" },
    updated_at: { type: ["string", "null"], format: "date-time" },
    expires_at: { type: "string", format: "date-time", description: "When the key is forgotten." },
    status: { type: "integer", description: "A finished compact key's saved status (no reply kept)." },
  },
};

function lookup(operationId: string, summary: string, parameters: Json[]): Json {
  return {
    get: {
      operationId,
      summary,
      description:
        "What became of an operation of yours, without sending its request again. Finished: its saved " +
        "answer exactly as a replay of the request gives it (the saved status, headers and body bytes, " +
        "`Idempotent-Replayed: true`, `Idempotency-Operation-State` `done` or `failed_not_applied`), " +
        "checked like a replay (401 once the API key is revoked). In progress or in review: the state " +
        "and timestamps. `?wait=SECONDS` holds the request while the operation is in progress, at most " +
        "20 s. Another account's reference, an unknown, expired or malformed one, and a key claimed " +
        "again since (a new operation) all get the same 404.",
      security: auth,
      parameters: [
        ...parameters,
        {
          name: "wait",
          in: "query",
          required: false,
          description: "Seconds to hold the request while the operation is in progress (cut to 20).",
          schema: { type: "number", minimum: 0 },
        },
      ],
      responses: {
        "200": jsonReply("The operation is in progress (or in review): its state.", operationSchema, {
          "Idempotency-Operation-State": ref("headers", "Idempotency-Operation-State"),
          "Idempotency-Operation-Ref": ref("headers", "Idempotency-Operation-Ref"),
        }),
        default: {
          description:
            "The operation is finished: its saved answer, as a replay gives it (any status it was saved with).",
          headers: {
            "Idempotent-Replayed": ref("headers", "Idempotent-Replayed"),
            "Idempotency-Expires": ref("headers", "Idempotency-Expires"),
            "Idempotency-Operation-Ref": ref("headers", "Idempotency-Operation-Ref"),
            "Idempotency-Operation-State": ref("headers", "Idempotency-Operation-State"),
          },
        },
        "400": problemReply("`wait` is not a number of seconds.", ["bad-request"]),
        "401": ref("responses", "Unauthorized"),
        "404": problemReply("No operation of yours has this reference or key.", ["operation-not-found"]),
      },
      "x-idempotency": unkeyed,
    },
  };
}

export function operationPaths(): Json {
  return {
    "/v1/operations/{ref}": lookup("getOperation", "An operation, by its reference", [
      pathParam(
        "ref",
        "The operation's reference: the `Idempotency-Operation-Ref` header of any answer to the keyed request, or `operation_ref` of its problem.",
      ),
    ]),
    "/v1/operations": lookup("getOperationByKey", "An operation, by your Idempotency-Key", [
      {
        name: "Idempotency-Key",
        in: "header",
        required: true,
        description: "The key the request was sent with (when its reply, and the reference, were lost).",
        schema: { type: "string" },
      },
    ]),
  };
}
