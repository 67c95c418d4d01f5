/**
 * The request schemas of the reference service: ONE schema per route body, used both to validate the
 * request (app/validate.ts compiles it with Ajv) and to write the OpenAPI document (app/openapi*.ts puts
 * the same object in it). Change a rule here and both follow.
 *
 * Each property's `description` is written as the rule itself ("a whole number from 1 to ..."): a 400
 * says `<field> must be <description>`, and the OpenAPI document shows the same sentence.
 *
 * Why TypeBox + Ajv (and not zod + @hono/zod-openapi): TypeBox builds plain JSON Schema objects, which
 * ARE what OpenAPI 3.1 embeds (no conversion step that can drift), with the TypeScript type of the
 * validated value derived from the same object (`Static<typeof X>`); Ajv compiles each schema once into a
 * plain function. Its cost (`npx tsx --conditions=source bench/schema.ts`, parse + check of a payment,
 * one run on the 2-core dev machine): 0.92 µs per valid JSON body against 0.76 µs for the hand-written
 * checks it replaced (1.2x), 2.1 against 3.2 µs for a form body, about 1-2 µs more for an invalid body
 * (the error sentence): noise next to a request's database round trips. zod would have meant a second
 * schema language converted into the JSON Schema the document must hold anyway, and wrapping every
 * route in `createRoute`, which the idempotency middleware's wiring does not need.
 */
import { type Static, Type } from "@sinclair/typebox";
import { IDEMPOTENCY_KEY_PATTERN, MAX_KEY_LENGTH } from "idem";

export const MAX_AMOUNT_CENTS = 100_000_000;
/** Ids chosen by callers (wallets, top-ups, products, carts, items) and ids in paths. */
export const ID_PATTERN = "^[A-Za-z0-9_-]{1,64}$";
export const ID_RULE = "1 to 64 letters, digits, _ or -";
export const CARD_PATTERN = "^[A-Za-z0-9_]{1,64}$";

export const AmountCents = Type.Integer({
  minimum: 1,
  maximum: MAX_AMOUNT_CENTS,
  description: `a whole number from 1 to ${MAX_AMOUNT_CENTS}`,
});

const Currency = Type.String({
  pattern: "^[a-z]{3}$",
  description: 'a three-letter lower-case ISO 4217 code such as "eur"',
  examples: ["eur"],
});

/** `POST /v1/payments` in atomic mode (JSON or form). */
export const PaymentRequest = Type.Object({ amount_cents: AmountCents, currency: Currency });
export type PaymentInput = Static<typeof PaymentRequest>;

/** `POST /v1/payments` in phases mode: plus the card charged at the provider (JSON or form). */
export const PhasesPaymentRequest = Type.Object({
  amount_cents: AmountCents,
  currency: Currency,
  card: Type.Optional(
    Type.Union([Type.String({ pattern: CARD_PATTERN }), Type.Null()], {
      description: "1 to 64 letters, digits or _ (a card number or token; 4000000000000002 is declined)",
    }),
  ),
});
export type PhasesPaymentInput = Static<typeof PhasesPaymentRequest>;

/** `POST /v1/orders` and `POST /v1/payments/{id}/refunds`. */
export const AmountRequest = Type.Object({ amount_cents: AmountCents });

/** `POST /v1/checkouts`: an order the checkout saga reserves, charges and ships (app/checkout/). */
export const CheckoutRequest = Type.Object({
  sku: Type.String({ pattern: ID_PATTERN, description: `${ID_RULE} (what to buy: mug, poster, lamp)` }),
  quantity: Type.Integer({ minimum: 1, maximum: 100, description: "a whole number from 1 to 100" }),
  amount_cents: AmountCents,
  country: Type.String({
    pattern: "^[a-z]{2}$",
    description:
      "a two-letter lower-case country code to ship to (the carrier ships to de, fr, nl, be, at, it, es)",
  }),
  card: Type.Optional(
    Type.String({
      pattern: CARD_PATTERN,
      description: "1 to 64 letters, digits or _ (4000000000000002 is declined)",
    }),
  ),
});
export type CheckoutInput = Static<typeof CheckoutRequest>;

/** `POST /v1/wallets/{wallet}/topups`. */
export const TopUpRequest = Type.Object({
  id: Type.String({
    pattern: ID_PATTERN,
    description: `${ID_RULE} (the top-up's id: chosen by you, unique in your account, reused on retries)`,
  }),
  amount_cents: AmountCents,
});

/** `PUT /v1/products/{id}`. */
export const ProductRequest = Type.Object({ price_cents: AmountCents });

/** `PUT /v1/carts/{cart}/items/{item}`. */
export const CartItemRequest = Type.Object({
  qty: Type.Integer({
    minimum: 0,
    maximum: 1000,
    description: "a whole number from 0 to 1000 (the quantity you want, not a change)",
  }),
});

/** Path parameters that name a caller-chosen id. */
export const IdParam = Type.String({ pattern: ID_PATTERN, description: ID_RULE });

/** The Idempotency-Key's own rule (from idem's core: src/core/key.ts), before sf-string quoting. */
export const IdempotencyKeyValue = Type.String({
  minLength: 1,
  maxLength: MAX_KEY_LENGTH,
  pattern: IDEMPOTENCY_KEY_PATTERN,
  description: `1 to ${MAX_KEY_LENGTH} visible ASCII characters (no spaces, no control characters)`,
});

export const PLAYGROUND_FAULTS = ["none", "lose-reply", "crash-after-charge", "slow-worker"] as const;
export type PlaygroundFault = (typeof PLAYGROUND_FAULTS)[number];

/** `POST /playground/api/pay`. */
export const PlaygroundPayRequest = Type.Object({
  key: IdempotencyKeyValue,
  amount_cents: AmountCents,
  card: Type.Optional(Type.String({ maxLength: 64, description: "at most 64 characters" })),
  fault: Type.Optional(
    Type.Union(
      PLAYGROUND_FAULTS.map((f) => Type.Literal(f)),
      { description: `one of ${PLAYGROUND_FAULTS.join(", ")}` },
    ),
  ),
});
export type PlaygroundPayInput = Static<typeof PlaygroundPayRequest>;

/** The playground's retry-storm live run (app/playground-storm.ts). */
export const StormRequest = Type.Object({
  attempts: Type.Array(Type.Integer({ minimum: 1, maximum: 5 }), {
    minItems: 1,
    maxItems: 5,
    description: "1 to 5 layers, each 1 to 5 attempts, the top first",
  }),
  failure: Type.Number({ minimum: 0, maximum: 1, description: "a failure rate from 0 to 1" }),
  budget: Type.Number({ minimum: 0, maximum: 1, description: "a retry budget ratio from 0 to 1" }),
  taps: Type.Integer({ minimum: 1, maximum: 200, description: "a whole number of taps from 1 to 200" }),
});
export type StormInput = Static<typeof StormRequest>;
