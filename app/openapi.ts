/**
 * The service's OpenAPI 3.1 document, served at `GET /openapi.json`: every endpoint, which of them take
 * an `Idempotency-Key` (and whether it is required), the key's format, how long keys are kept, and every
 * reply, replays included. `docs/contract.md` says the same for people.
 *
 * Each operation also carries an `x-idempotency` extension for tools:
 * `{ required, retentionSeconds, replayHeader: "Idempotent-Replayed" }` (`required: false` with
 * `retentionSeconds: null` for operations that need no key because they are safe to repeat as they are).
 */

export interface OpenApiOptions {
  /** How long keys are kept (the store's `retentionMs`). */
  retentionMs: number;
  /** `phases` (default): payments charge a provider (adds 402, 502 and 503). */
  paymentsMode?: "phases" | "atomic";
  /** Atomic mode only: whether `POST /v1/payments` requires a key. Default: true. */
  requireKey?: boolean;
  /** Document the playground's endpoints too (demo mode only). Default: false. */
  playground?: boolean;
}

type Json = Record<string, unknown>;

const ref = (kind: string, name: string) => ({ $ref: `#/components/${kind}/${name}` });

/** The key: visible ASCII (0x21-0x7E) only. */
export const IDEMPOTENCY_KEY_PATTERN = "^[\\x21-\\x7E]+$";

function problemReply(description: string, codes: string[], extraHeaders: Json = {}): Json {
  return {
    description: `${description} Problem type: ${codes.map((c) => `\`urn:idem:problem:${c}\``).join(", ")}.`,
    headers: extraHeaders,
    content: { "application/problem+json": { schema: ref("schemas", "Problem") } },
  };
}

/** The replies every keyed POST can give besides its own success. */
function keyedReplies(phases: boolean): Json {
  const replies: Json = {
    "400": ref("responses", "BadRequest"),
    "401": ref("responses", "Unauthorized"),
    "409": ref("responses", "InFlight"),
    "413": ref("responses", "BodyTooLarge"),
    "415": ref("responses", "UnsupportedMediaType"),
    "422": ref("responses", "KeyMismatch"),
    "500": ref("responses", "InternalError"),
  };
  if (phases) replies["503"] = ref("responses", "Retryable");
  return replies;
}

function successWithReplay(description: string, schema: Json, location: boolean): Json {
  const headers: Json = {
    "Idempotency-Expires": ref("headers", "Idempotency-Expires"),
    "Idempotent-Replayed": ref("headers", "Idempotent-Replayed"),
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

const auth = [{ bearer: [] }];
const jsonReply = (description: string, schema: Json, headers?: Json): Json => ({
  description,
  ...(headers ? { headers } : {}),
  content: { "application/json": { schema } },
});
const jsonBody = (schema: Json, alsoForm = false): Json => ({
  required: true,
  content: {
    "application/json": { schema },
    ...(alsoForm ? { "application/x-www-form-urlencoded": { schema } } : {}),
  },
});
const pathParam = (name: string, description: string): Json => ({
  name,
  in: "path",
  required: true,
  description,
  schema: { type: "string", pattern: "^[A-Za-z0-9_-]{1,64}$" },
});

/** The OpenAPI 3.1 document of the reference payments service. */
export function openApiDocument(options: OpenApiOptions): Json {
  const retentionSeconds = Math.round(options.retentionMs / 1000);
  const phases = (options.paymentsMode ?? "phases") === "phases";
  const paymentKeyRequired = phases || (options.requireKey ?? true);
  const keyed = (required: boolean) => ({
    required,
    retentionSeconds,
    replayHeader: "Idempotent-Replayed",
  });
  const unkeyed = { required: false, retentionSeconds: null, replayHeader: null };
  const hours = retentionSeconds / 3600;
  const retention = Number.isInteger(hours) ? `${hours} hours` : `${retentionSeconds} seconds`;

  const paymentReplies: Json = {
    "201": successWithReplay("The payment was made.", ref("schemas", "Payment"), true),
    ...keyedReplies(phases),
  };
  if (phases) {
    paymentReplies["402"] = problemReply(
      "The card was declined. A final answer: saved and replayed like a 201 (with `Idempotent-Replayed: true` on retries).",
      ["card-declined"],
      {
        "Idempotency-Expires": ref("headers", "Idempotency-Expires"),
        "Idempotent-Replayed": ref("headers", "Idempotent-Replayed"),
      },
    );
    paymentReplies["502"] = problemReply("The payment provider refused the request itself. Not saved.", [
      "provider-rejected",
    ]);
  }

  const paths: Json = {
    "/v1/payments": {
      post: {
        operationId: "createPayment",
        summary: "Charge a card",
        description: phases
          ? "Charges the card at the payment provider through recovery points (started -> charged -> done). " +
            "The provider receives `<account>:<Idempotency-Key>` as its own key, so a retry never charges twice."
          : "Records a payment (atomic mode: the payment row and the saved reply commit together).",
        security: auth,
        parameters: [ref("parameters", paymentKeyRequired ? "IdempotencyKey" : "IdempotencyKeyOptional")],
        requestBody: jsonBody(ref("schemas", "PaymentRequest"), true),
        responses: paymentReplies,
        "x-idempotency": keyed(paymentKeyRequired),
      },
      get: {
        operationId: "listPayments",
        summary: "The account's last 100 payments, newest first",
        security: auth,
        responses: {
          "200": jsonReply("The payments.", {
            type: "object",
            required: ["data"],
            properties: { data: { type: "array", items: ref("schemas", "Payment") } },
          }),
          "401": ref("responses", "Unauthorized"),
        },
        "x-idempotency": unkeyed,
      },
    },
    "/v1/payments/{id}": {
      get: {
        operationId: "getPayment",
        summary: "One payment",
        security: auth,
        parameters: [pathParam("id", "The payment's id (`pay_...`).")],
        responses: {
          "200": jsonReply("The payment.", ref("schemas", "Payment")),
          "401": ref("responses", "Unauthorized"),
          "404": ref("responses", "NotFound"),
        },
        "x-idempotency": unkeyed,
      },
    },
    "/v1/payments/{id}/refunds": {
      post: {
        operationId: "createRefund",
        summary: "Refund part or all of a payment",
        security: auth,
        parameters: [pathParam("id", "The payment to refund."), ref("parameters", "IdempotencyKey")],
        requestBody: jsonBody(ref("schemas", "AmountRequest")),
        responses: {
          "201": successWithReplay("The refund was made.", ref("schemas", "Refund"), false),
          ...keyedReplies(false),
          "404": ref("responses", "NotFound"),
          "422": {
            description:
              "`urn:idem:problem:idempotency-key-mismatch`: the key was used for another request; or " +
              "`urn:idem:problem:refund-too-large`: more than what is left of the payment.",
            content: { "application/problem+json": { schema: ref("schemas", "Problem") } },
          },
        },
        "x-idempotency": keyed(true),
      },
    },
    "/v1/orders": {
      post: {
        operationId: "createOrder",
        summary: "Create a paid order",
        security: auth,
        parameters: [ref("parameters", "IdempotencyKey")],
        requestBody: jsonBody(ref("schemas", "AmountRequest")),
        responses: {
          "201": successWithReplay("The order was created.", ref("schemas", "Order"), true),
          ...keyedReplies(false),
        },
        "x-idempotency": keyed(true),
      },
    },
    "/v1/orders/{id}": {
      get: {
        operationId: "getOrder",
        summary: "One order",
        security: auth,
        parameters: [pathParam("id", "The order's id (`ord_...`).")],
        responses: {
          "200": jsonReply("The order.", ref("schemas", "Order")),
          "401": ref("responses", "Unauthorized"),
          "404": ref("responses", "NotFound"),
        },
        "x-idempotency": unkeyed,
      },
    },
    "/v1/orders/{id}/ship": {
      post: {
        operationId: "shipOrder",
        summary: "Ship a paid order (a one-way conditional write: repeating it changes nothing)",
        security: auth,
        parameters: [pathParam("id", "The order's id.")],
        responses: {
          "200": jsonReply("The order is shipped; `changed` tells whether this call shipped it.", {
            type: "object",
            required: ["id", "status", "changed"],
            properties: {
              id: { type: "string" },
              status: { const: "shipped" },
              changed: { type: "boolean" },
            },
          }),
          "401": ref("responses", "Unauthorized"),
          "404": ref("responses", "NotFound"),
          "409": problemReply("The order is not in a state that can be shipped.", ["order-not-shippable"]),
        },
        "x-idempotency": unkeyed,
      },
    },
    "/v1/wallets/{wallet}/topups": {
      post: {
        operationId: "topUpWallet",
        summary: "Top up a wallet with a top-up id you choose (reuse it on retries; no key needed)",
        security: auth,
        parameters: [pathParam("wallet", "The wallet's id.")],
        requestBody: jsonBody({
          type: "object",
          required: ["id", "amount_cents"],
          properties: {
            id: { type: "string", pattern: "^[A-Za-z0-9_-]{1,64}$" },
            amount_cents: ref("schemas", "AmountCents"),
          },
        }),
        responses: {
          "201": jsonReply("The top-up was applied.", ref("schemas", "TopUp")),
          "200": jsonReply("The top-up had been applied before; nothing changed.", ref("schemas", "TopUp")),
          "400": ref("responses", "BadRequest"),
          "401": ref("responses", "Unauthorized"),
          "409": problemReply("This top-up id was used for another top-up.", ["topup-id-taken"]),
          "413": ref("responses", "BodyTooLarge"),
          "415": ref("responses", "UnsupportedMediaType"),
        },
        "x-idempotency": unkeyed,
      },
    },
    "/v1/wallets/{wallet}": {
      get: {
        operationId: "getWallet",
        summary: "A wallet's balance (the sum of its top-ups)",
        security: auth,
        parameters: [pathParam("wallet", "The wallet's id.")],
        responses: {
          "200": jsonReply("The wallet.", {
            type: "object",
            required: ["id", "balance_cents"],
            properties: { id: { type: "string" }, balance_cents: { type: "integer" } },
          }),
          "401": ref("responses", "Unauthorized"),
        },
        "x-idempotency": unkeyed,
      },
    },
    "/v1/products/{id}": {
      get: {
        operationId: "getProduct",
        summary: "A product's price and version (its ETag)",
        security: auth,
        parameters: [pathParam("id", "The product's id.")],
        responses: {
          "200": jsonReply("The product.", ref("schemas", "Product"), { ETag: ref("headers", "ETag") }),
          "401": ref("responses", "Unauthorized"),
          "404": ref("responses", "NotFound"),
        },
        "x-idempotency": unkeyed,
      },
      put: {
        operationId: "putProduct",
        summary: "Create a product, or change its price with `If-Match` (optimistic locking)",
        security: auth,
        parameters: [
          pathParam("id", "The product's id."),
          {
            name: "If-Match",
            in: "header",
            required: false,
            description:
              'The ETag from the last read, such as `"v3"`. Required to change an existing product.',
            schema: { type: "string", pattern: '^"v[0-9]{1,9}"$' },
          },
        ],
        requestBody: jsonBody({
          type: "object",
          required: ["price_cents"],
          properties: { price_cents: ref("schemas", "AmountCents") },
        }),
        responses: {
          "201": jsonReply("The product was created (version 1).", ref("schemas", "Product"), {
            ETag: ref("headers", "ETag"),
          }),
          "200": jsonReply("The price was changed.", ref("schemas", "Product"), {
            ETag: ref("headers", "ETag"),
          }),
          "400": ref("responses", "BadRequest"),
          "401": ref("responses", "Unauthorized"),
          "404": ref("responses", "NotFound"),
          "412": problemReply(
            "The product changed since that ETag: read it again. The current ETag is sent.",
            ["precondition-failed"],
            { ETag: ref("headers", "ETag") },
          ),
          "413": ref("responses", "BodyTooLarge"),
          "415": ref("responses", "UnsupportedMediaType"),
          "428": problemReply("The product exists: send `If-Match` to change it.", ["precondition-required"]),
        },
        "x-idempotency": unkeyed,
      },
    },
    "/v1/carts/{cart}/items/{item}": {
      put: {
        operationId: "putCartItem",
        summary: "Set an item's quantity (the result, not a change: repeating it is harmless)",
        security: auth,
        parameters: [pathParam("cart", "The cart's id."), pathParam("item", "The item's id.")],
        requestBody: jsonBody({
          type: "object",
          required: ["qty"],
          properties: { qty: { type: "integer", minimum: 0, maximum: 1000 } },
        }),
        responses: {
          "200": jsonReply("The quantity now.", {
            type: "object",
            required: ["cart_id", "item_id", "qty"],
            properties: {
              cart_id: { type: "string" },
              item_id: { type: "string" },
              qty: { type: "integer" },
            },
          }),
          "400": ref("responses", "BadRequest"),
          "401": ref("responses", "Unauthorized"),
          "413": ref("responses", "BodyTooLarge"),
          "415": ref("responses", "UnsupportedMediaType"),
        },
        "x-idempotency": unkeyed,
      },
    },
    "/v1/carts/{cart}": {
      get: {
        operationId: "getCart",
        summary: "A cart's items",
        security: auth,
        parameters: [pathParam("cart", "The cart's id.")],
        responses: {
          "200": jsonReply("The cart.", {
            type: "object",
            required: ["id", "items"],
            properties: {
              id: { type: "string" },
              items: {
                type: "array",
                items: {
                  type: "object",
                  required: ["item_id", "qty"],
                  properties: { item_id: { type: "string" }, qty: { type: "integer" } },
                },
              },
            },
          }),
          "401": ref("responses", "Unauthorized"),
        },
        "x-idempotency": unkeyed,
      },
    },
    "/health": {
      get: {
        operationId: "health",
        summary: "Liveness and database reachability",
        security: [],
        responses: {
          "200": jsonReply("The service and its database answer.", {
            type: "object",
            required: ["status", "database", "retention_seconds"],
            properties: {
              status: { const: "ok" },
              database: { const: "ok" },
              retention_seconds: { type: "number", description: "How long idempotency keys are kept." },
            },
          }),
          "503": problemReply("The database does not answer.", ["database-unavailable"]),
        },
        "x-idempotency": unkeyed,
      },
    },
    "/metrics": {
      get: {
        operationId: "metrics",
        summary: "Prometheus metrics (text exposition format)",
        security: [],
        responses: {
          "200": { description: "The metrics.", content: { "text/plain": { schema: { type: "string" } } } },
        },
        "x-idempotency": unkeyed,
      },
    },
    "/openapi.json": {
      get: {
        operationId: "openapi",
        summary: "This document",
        security: [],
        responses: { "200": jsonReply("The OpenAPI document.", { type: "object" }) },
        "x-idempotency": unkeyed,
      },
    },
  };

  if (options.playground) Object.assign(paths, playgroundPaths());

  return {
    openapi: "3.1.0",
    info: {
      title: "idem reference payments API",
      version: "0.1.0",
      summary: "Payments made once over networks that deliver at least once.",
      description:
        "Every POST that creates something takes an `Idempotency-Key`. Keys are kept for " +
        `${retention} (\`x-idempotency.retentionSeconds\`: ${retentionSeconds}); every keyed reply that was ` +
        "saved carries `Idempotency-Expires`. Keys are per account. See docs/contract.md.",
      license: { name: "MIT", identifier: "MIT" },
    },
    jsonSchemaDialect: "https://spec.openapis.org/oas/3.1/dialect/base",
    servers: [{ url: "/" }],
    security: auth,
    tags: [{ name: "payments" }, { name: "patterns" }, { name: "operations" }],
    paths,
    components: {
      securitySchemes: {
        bearer: {
          type: "http",
          scheme: "bearer",
          description: "`Authorization: Bearer <api key>`. The account it names is the scope of your keys.",
        },
      },
      parameters: {
        IdempotencyKey: idempotencyKeyParameter(true, retention),
        IdempotencyKeyOptional: idempotencyKeyParameter(false, retention),
      },
      headers: {
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
        "Retry-After": {
          description:
            "Seconds to wait before retrying with the same key. Always sent with `503` and with the " +
            "`idempotency-key-in-flight` `409` (the lease's time left); not with `idempotency-lease-lost`, " +
            "which only the worker that lost its lease sees.",
          schema: { type: "integer", minimum: 1 },
        },
        Location: {
          description: "The created resource.",
          required: true,
          schema: { type: "string" },
        },
        ETag: { description: 'The version, such as `"v3"`.', required: true, schema: { type: "string" } },
      },
      responses: {
        BadRequest: problemReply(
          "The key is missing or invalid, or the body is invalid. Nothing was saved: fix the request and send it again.",
          ["idempotency-key-missing", "idempotency-key-invalid", "invalid-body", "invalid-if-match"],
        ),
        Unauthorized: problemReply("Missing or unknown API key. Checked before the key is claimed.", [
          "unauthorized",
        ]),
        InFlight: problemReply(
          "A request with this key is still being worked on (or, in phases mode, a slow worker lost its lease to a retry). Not saved: retry with the same key after `Retry-After` seconds.",
          ["idempotency-key-in-flight", "idempotency-lease-lost"],
          { "Retry-After": ref("headers", "Retry-After") },
        ),
        KeyMismatch: problemReply(
          "The key was already used for another request (method, path or body differ). Not saved; do not retry: a new request needs a new key.",
          ["idempotency-key-mismatch"],
        ),
        BodyTooLarge: problemReply("The body is over 16 KiB.", ["body-too-large"]),
        UnsupportedMediaType: problemReply("The body's Content-Type is not accepted.", [
          "unsupported-media-type",
        ]),
        NotFound: problemReply("No such resource in your account.", ["not-found"]),
        InternalError: problemReply(
          "The server failed. Nothing was saved: a retry with the same key is safe.",
          ["internal-error"],
        ),
        Retryable: problemReply(
          "A transient failure (the payment provider did not answer, or the database was busy). Not saved and the lease was freed: retry with the same key after `Retry-After`.",
          ["retryable-failure"],
          { "Retry-After": ref("headers", "Retry-After") },
        ),
      },
      schemas: {
        Problem: {
          type: "object",
          description: "RFC 9457 problem details.",
          required: ["type", "title", "status"],
          properties: {
            type: { type: "string", description: "Stable: `urn:idem:problem:<code>`." },
            title: { type: "string" },
            status: { type: "integer", minimum: 400, maximum: 599 },
            detail: { type: "string" },
          },
        },
        AmountCents: { type: "integer", minimum: 1, maximum: 100_000_000 },
        PaymentRequest: {
          type: "object",
          required: ["amount_cents", "currency"],
          properties: {
            amount_cents: ref("schemas", "AmountCents"),
            currency: { type: "string", pattern: "^[a-z]{3}$", examples: ["eur"] },
            ...(phases
              ? {
                  card: {
                    type: "string",
                    pattern: "^[A-Za-z0-9_]{1,64}$",
                    description: "Card number or token. `4000000000000002` is always declined (402).",
                  },
                }
              : {}),
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
        AmountRequest: {
          type: "object",
          required: ["amount_cents"],
          properties: { amount_cents: ref("schemas", "AmountCents") },
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
      },
    },
  };
}

function idempotencyKeyParameter(required: boolean, retention: string): Json {
  return {
    name: "Idempotency-Key",
    in: "header",
    required,
    description:
      "One key per intent: create it when the intent begins (a random UUID) and send it on every retry of " +
      "that intent. An RFC 8941 sf-string, quoted on the wire as the IETF draft has it " +
      '(`Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`); a bare token is accepted too and names ' +
      "the same key. 1 to 255 visible ASCII characters (no spaces, no control characters; inside the " +
      'quotes, `"` is sent as `\\"` and `\\` as `\\\\`). The length limits and the pattern are the key\'s own; the ' +
      `sf-string's quotes and escapes come on top. Kept for ${retention}; keys are per account.` +
      (required ? " Missing or invalid: 400." : " Optional here; invalid: 400."),
    schema: {
      type: "string",
      minLength: 1,
      maxLength: 255,
      pattern: IDEMPOTENCY_KEY_PATTERN,
      examples: ['"8e03978e-40d5-43e8-bc93-6894a57f9324"'],
    },
  };
}

/** The playground's JSON endpoints (only served with the demo accounts). */
function playgroundPaths(): Json {
  const anyObject = { type: "object" };
  return {
    "/playground/api/pay": {
      post: {
        operationId: "playgroundPay",
        summary: "Playground: pay as the demo account, with a chosen fault, and report what the client saw",
        tags: ["playground"],
        security: [],
        requestBody: jsonBody({
          type: "object",
          required: ["key", "amount_cents"],
          properties: {
            key: { type: "string" },
            amount_cents: ref("schemas", "AmountCents"),
            card: { type: "string" },
            fault: { type: "string", enum: ["none", "lose-reply", "crash-after-charge", "slow-worker"] },
          },
        }),
        responses: {
          "200": jsonReply("What the client saw (or that it saw nothing).", anyObject),
          "400": ref("responses", "BadRequest"),
        },
        "x-idempotency": { required: false, retentionSeconds: null, replayHeader: null },
      },
    },
    "/playground/api/state": {
      get: {
        operationId: "playgroundState",
        summary: "Playground: the key row, the provider's charges, the outbox and the emails sent",
        tags: ["playground"],
        security: [],
        parameters: [{ name: "key", in: "query", required: false, schema: { type: "string" } }],
        responses: { "200": jsonReply("The state.", anyObject) },
        "x-idempotency": { required: false, retentionSeconds: null, replayHeader: null },
      },
    },
  };
}
