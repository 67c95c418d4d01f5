/**
 * The service's OpenAPI 3.1 document, served at `GET /openapi.json`: every endpoint, which of them take
 * an `Idempotency-Key` (and whether it is required), the key's format, how long keys are kept, how long
 * the server may hold a request, and every reply, replays included. `docs/contract.md` says the same for
 * people. The request bodies are app/schemas.ts's schemas, the very ones the service validates with.
 *
 * Each operation also carries an `x-idempotency` extension for tools:
 * `{ required, retentionSeconds, replayHeader: "Idempotent-Replayed", answerWithinSeconds }` (all but
 * `required: false` null for operations that need no key because they are safe to repeat as they are).
 */

import { mcpPaths } from "./mcp-route.ts";
import { operationPaths } from "./openapi-operations.ts";
import {
  componentHeaders,
  componentResponses,
  idempotencyKeyParameter,
  type Json,
  replySchemas,
} from "./openapi-parts.ts";
import { playgroundPaths, servicePaths } from "./openapi-paths.ts";
import { providerWebhookPaths } from "./provider-webhooks.ts";
import {
  AmountRequest,
  CartItemRequest,
  CheckoutRequest,
  PaymentRequest,
  PhasesPaymentRequest,
  PlaygroundPayRequest,
  ProductRequest,
  StormRequest,
  TopUpRequest,
} from "./schemas.ts";

export interface OpenApiOptions {
  /** How long keys are kept (the store's `retentionMs`). */
  retentionMs: number;
  /** Atomic routes' duplicate wait (the store's `lockTimeoutMs`): their answer bound. Default: 5,000. */
  lockTimeoutMs?: number;
  /** Phases payments' answer bound (`Idempotency-Answer-Within`). Default: 5,000. */
  answerWithinMs?: number;
  /** `phases` (default): payments charge a provider (adds 402, 502 and 503). */
  paymentsMode?: "phases" | "atomic";
  /** Atomic mode only: whether `POST /v1/payments` requires a key. Default: true. */
  requireKey?: boolean;
  /** Document the playground's endpoints too (demo mode only). Default: false. */
  playground?: boolean;
  /** Document `POST /v1/webhooks/provider` (served when the provider's webhook secret is set). Default: false. */
  providerWebhooks?: boolean;
}

/** The OpenAPI 3.1 document of the reference payments service. */
export function openApiDocument(options: OpenApiOptions): Json {
  const retentionSeconds = Math.round(options.retentionMs / 1000);
  const phases = (options.paymentsMode ?? "phases") === "phases";
  const hours = retentionSeconds / 3600;
  const retention = Number.isInteger(hours) ? `${hours} hours` : `${retentionSeconds} seconds`;
  const paths = servicePaths({
    phases,
    paymentKeyRequired: phases || (options.requireKey ?? true),
    retentionSeconds,
    answerWithinSeconds: Math.ceil((options.answerWithinMs ?? 5_000) / 1000),
    lockSeconds: Math.ceil((options.lockTimeoutMs ?? 5_000) / 1000),
  });
  Object.assign(paths, operationPaths(), mcpPaths());
  if (options.playground) Object.assign(paths, playgroundPaths());
  if (options.providerWebhooks) Object.assign(paths, providerWebhookPaths());

  return {
    openapi: "3.1.0",
    info: {
      title: "idem reference payments API",
      version: "0.1.0",
      summary: "Payments made once over networks that deliver at least once.",
      description:
        "Every POST that creates something takes an `Idempotency-Key`. Keys are kept for " +
        `${retention} (\`x-idempotency.retentionSeconds\`: ${retentionSeconds}); every keyed reply that was ` +
        "saved carries `Idempotency-Expires`, and every keyed reply `Idempotency-Answer-Within` (the " +
        "longest the server holds such a request, `x-idempotency.answerWithinSeconds`). Keys are per " +
        "account. See docs/contract.md.",
      license: { name: "MIT", identifier: "MIT" },
    },
    jsonSchemaDialect: "https://spec.openapis.org/oas/3.1/dialect/base",
    servers: [{ url: "/" }],
    security: [{ bearer: [] }],
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
      headers: componentHeaders(retention),
      responses: componentResponses,
      schemas: {
        ...replySchemas,
        // The request schemas: the objects app/validate.ts validates with (JSON keeps only JSON Schema).
        ...plain({
          PaymentRequest: phases ? PhasesPaymentRequest : PaymentRequest,
          AmountRequest,
          CheckoutRequest,
          TopUpRequest,
          ProductRequest,
          CartItemRequest,
          ...(options.playground ? { PlaygroundPayRequest, StormRequest } : {}),
        }),
      },
    },
  };
}

/** TypeBox schemas carry symbol keys; the document holds their plain JSON Schema. */
function plain(schemas: Record<string, unknown>): Json {
  return JSON.parse(JSON.stringify(schemas)) as Json;
}
