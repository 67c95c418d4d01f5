/**
 * The paths of the OpenAPI document (app/openapi.ts): every route the service serves. Request bodies are
 * `$ref`s to app/schemas.ts's schemas (placed under components by openapi.ts).
 */
import {
  auth,
  type Json,
  jsonBody,
  jsonReply,
  keyedReplies,
  pathParam,
  problemReply,
  ref,
  successWithReplay,
} from "./openapi-parts.ts";

export interface PathsContext {
  phases: boolean;
  paymentKeyRequired: boolean;
  retentionSeconds: number;
  /** Phases payments' answer bound (seconds). */
  answerWithinSeconds: number;
  /** Atomic routes' answer bound: the store's lock timeout (seconds). */
  lockSeconds: number;
}

const unkeyed = { required: false, retentionSeconds: null, replayHeader: null, answerWithinSeconds: null };

/** The service's paths (the playground's are `playgroundPaths`). */
export function servicePaths(c: PathsContext): Json {
  const { phases, paymentKeyRequired } = c;
  const keyed = (required: boolean, answerWithinSeconds: number) => ({
    required,
    retentionSeconds: c.retentionSeconds,
    replayHeader: "Idempotent-Replayed",
    answerWithinSeconds,
  });
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
      true,
    );
    paymentReplies["502"] = problemReply(
      "The payment provider refused the request itself. Not saved.",
      ["provider-rejected"],
      {},
      true,
    );
  }

  return {
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
        "x-idempotency": keyed(paymentKeyRequired, phases ? c.answerWithinSeconds : c.lockSeconds),
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
          "422": problemReply(
            "The key was used for another request (`idempotency-key-mismatch`), or the refund is more " +
              "than what is left of the payment (`refund-too-large`, a final answer, saved and replayed).",
            ["idempotency-key-mismatch", "refund-too-large"],
            {},
            true,
          ),
        },
        "x-idempotency": keyed(true, c.lockSeconds),
      },
    },
    "/v1/checkouts": {
      post: {
        operationId: "createCheckout",
        summary:
          "Place a checkout: the saga then reserves stock, charges the card and ships (or compensates)",
        security: auth,
        parameters: [ref("parameters", "IdempotencyKey")],
        requestBody: jsonBody(ref("schemas", "CheckoutRequest")),
        responses: {
          "202": successWithReplay(
            "The checkout was placed; follow it at its Location.",
            {
              type: "object",
              required: ["id", "status"],
              properties: { id: { type: "string" }, status: { const: "placed" } },
            },
            true,
          ),
          ...keyedReplies(false),
        },
        "x-idempotency": keyed(true, c.lockSeconds),
      },
    },
    "/v1/checkouts/{id}": {
      get: {
        operationId: "getCheckout",
        summary: "One checkout, with every step its saga took",
        security: auth,
        parameters: [pathParam("id", "The checkout's id (`co_...`).")],
        responses: {
          "200": jsonReply("The checkout.", { type: "object" }),
          "401": ref("responses", "Unauthorized"),
          "404": ref("responses", "NotFound"),
        },
        "x-idempotency": unkeyed,
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
        "x-idempotency": keyed(true, c.lockSeconds),
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
        requestBody: jsonBody(ref("schemas", "TopUpRequest")),
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
        requestBody: jsonBody(ref("schemas", "ProductRequest")),
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
        requestBody: jsonBody(ref("schemas", "CartItemRequest")),
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
}

/** The playground's JSON endpoints (only served with the demo accounts). */
export function playgroundPaths(): Json {
  const anyObject = { type: "object" };
  return {
    "/playground/api/pay": {
      post: {
        operationId: "playgroundPay",
        summary: "Playground: pay as the demo account, with a chosen fault, and report what the client saw",
        tags: ["playground"],
        security: [],
        requestBody: jsonBody(ref("schemas", "PlaygroundPayRequest")),
        responses: {
          "200": jsonReply("What the client saw (or that it saw nothing).", anyObject),
          "400": ref("responses", "BadRequest"),
        },
        "x-idempotency": unkeyed,
      },
    },
    "/playground/api/storm": {
      post: {
        operationId: "playgroundStorm",
        summary: "Playground: taps through layers of idem clients over a failing bottom, measured",
        tags: ["playground"],
        security: [],
        requestBody: jsonBody(ref("schemas", "StormRequest")),
        responses: {
          "200": jsonReply("What the bottom received per tap, with and without a retry budget.", anyObject),
          "400": ref("responses", "BadRequest"),
        },
        "x-idempotency": unkeyed,
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
        "x-idempotency": unkeyed,
      },
    },
  };
}
