/**
 * Payments in phases mode: the card is charged at a payment provider (the simulator from
 * `idem/testing`, over HTTP), which no ROLLBACK can undo. The request is a small state machine:
 *
 *   started  (external) charge the provider with the key `<account>:<Idempotency-Key>`; a decline is a
 *            final answer (402, saved and replayed); a timeout or 5xx frees the lease (503, retry)
 *   charged  (local)    one transaction: the payment row, one `receipt-email` outbox row, and done (201)
 *
 * A client that never retries after a crash is finished by the completer (`idem complete` with this
 * module: see `idemRunners`).
 */
import { createHmac, randomBytes } from "node:crypto";
import { Hono, type MiddlewareHandler } from "hono";
import { bodyLimit } from "hono/body-limit";
import { FAILED_NOT_APPLIED, problemResponse, RetryableError } from "idem";
import { idempotentPhases } from "idem/hono";
import {
  type Db,
  definePhases,
  jsonResponse,
  type PhaseFaults,
  type PhasesRunner,
  type PostgresStore,
  writeOutbox,
} from "idem/postgres";
import { chargeProvider, findCharges } from "idem/testing";
import type { ApiKeys } from "./accounts.ts";
import { loadConfig, providerUrlOf } from "./config.ts";
import {
  authenticate,
  MAX_BODY_BYTES,
  type PaymentInput,
  paymentReadRoutes,
  replayAuthorized,
  toPayment,
} from "./payments.ts";
import { problem } from "./problems.ts";
import { type PhasesPaymentInput, PhasesPaymentRequest } from "./schemas.ts";
import { validBody } from "./validate.ts";

/**
 * What the runner stores with the key (for the completer): the validated payment, with the card as the
 * provider gets it (`providerCard`): never a card number in clear.
 */
export interface PaymentJob extends PaymentInput {
  /** A card token (or a public test card number); the simulator declines chosen ones. */
  card?: string;
}
type PaymentData = { chargeId: string };
type Env = { Variables: { accountId: string; body: PhasesPaymentInput; payment: PaymentJob } };

export interface PaymentPhasesOptions {
  /**
   * The route's answer bound: a payment still charging then is answered 409 in flight, Retry-After,
   * while it goes on. Default: 5,000 ms (the contract's; the playground's slow worker waits it out).
   */
  answerWithinMs?: number;
  store: PostgresStore;
  /** Base URL of the payment provider (`idem provider`, or `startProvider()` in tests). */
  providerUrl: string;
  /** Lease length. Default: 10,000 ms (the runner's). */
  leaseMs?: number;
  /** The provider call's own timeout; well under the lease. Default: 10,000 ms. */
  providerTimeoutMs?: number;
  /** Crash points (tests only). */
  faults?: PhaseFaults;
  /** Called when a key is taken over from a worker whose lease expired (metrics). */
  onLeaseTakeover?: () => void;
  /**
   * Whether the provider dedups by `Idempotency-Key`. `false` (a provider without idempotency keys,
   * e.g. `idem provider` with `idempotency: false`): the charge carries our reference instead, and after
   * an unknown outcome the runner searches for it before charging again; what it cannot settle goes to
   * review (`idem keys list --state needs_review`). Default: true (the service and `idemRunners` read
   * PROVIDER_IDEMPOTENCY, app/config.ts).
   */
  providerIdempotency?: boolean;
  /** Called when a payment's outcome is unknown and it goes to review (metrics, alerts). */
  onNeedsReview?: () => void;
  /**
   * The HMAC key card numbers are tokenized under (IDEM_CARD_TOKEN_KEY, read by app/config.ts). Default:
   * a random key per process.
   */
  cardTokenKey?: string;
}

export const PAYMENTS_RUNNER = "payments";

/** The card number the service's simulator declines (as Stripe's test card of that number does). */
export const DECLINED_TEST_CARD = "4000000000000002";

// The key when no `cardTokenKey` is given (IDEM_CARD_TOKEN_KEY unset): one per process.
const PROCESS_CARD_TOKEN_KEY = randomBytes(32).toString("hex");

/**
 * The card as stored with the key (for the completer, in `idem.keys.request`) and sent to the provider:
 * a card number (12-19 digits) becomes `tok_<HMAC-SHA256 under IDEM_CARD_TOKEN_KEY, 24 hex>`, so the
 * database holds no card number in clear; tokens and public test card numbers pass as they are (the
 * simulator declines DECLINED_TEST_CARD by its number).
 */
export function providerCard(card: string, key: string = PROCESS_CARD_TOKEN_KEY): string {
  if (card === DECLINED_TEST_CARD || !/^\d{12,19}$/.test(card)) return card;
  return `tok_${createHmac("sha256", key).update(card).digest("hex").slice(0, 24)}`;
}

/** The payments state machine. Its name is stored with each key; the completer finds it by that name. */
export function paymentPhasesRunner(o: PaymentPhasesOptions): PhasesRunner<PaymentJob, PaymentData> {
  const dedup = o.providerIdempotency ?? true;
  return definePhases<PaymentJob, PaymentData>({
    store: o.store,
    name: PAYMENTS_RUNNER,
    leaseMs: o.leaseMs,
    faults: o.faults,
    onLeaseTakeover: o.onLeaseTakeover,
    onNeedsReview: o.onNeedsReview,
    phases: {
      started: {
        external: async (ctx) => {
          const r = await chargeProvider(o.providerUrl, {
            amount: ctx.input.amount_cents,
            currency: ctx.input.currency,
            card: ctx.input.card,
            // OUR key, passed downstream: a repeat costs nothing. It is also the charge's reference,
            // which `lookup` searches by (without provider idempotency) and the provider's report
            // carries for `idem reconcile`.
            ...(dedup ? { idempotencyKey: ctx.idempotencyKey } : {}),
            reference: ctx.idempotencyKey,
            timeoutMs: o.providerTimeoutMs ?? 10_000,
            signal: ctx.signal,
          });
          switch (r.kind) {
            case "charged":
              return { data: { chargeId: r.charge.id } };
            case "declined":
              return {
                // a final answer that charged nothing: saved, replayed, and a new key is safe
                response: problemResponse(402, "card-declined", `The card was declined (${r.code}).`, {
                  operation: FAILED_NOT_APPLIED,
                }),
              };
            case "rejected": // the provider refused the request itself: not final for us, not saved
              return {
                // After a call to the provider nobody here can say it did nothing: never a new key; and
                // the same request would be refused again. A person looks (operation_ref).
                response: problemResponse(
                  502,
                  "provider-rejected",
                  `The payment provider refused: ${r.message}`,
                  {
                    operation: {
                      operation_state: "uncertain",
                      retry_same_key: false,
                      safe_new_key: false,
                      operation_ref: ctx.operationRef,
                    },
                  },
                ),
              };
            default:
              throw new RetryableError(
                `The payment provider did not answer (${r.reason}); retry with the same key.`,
              );
          }
        },
        ...(dedup
          ? {}
          : {
              lookup: async (ctx) => {
                const [charge] = await findCharges(o.providerUrl, ctx.idempotencyKey, { timeoutMs: 5_000 });
                if (!charge) return undefined; // sure it did not charge: the runner charges again
                if (charge.status === "failed") {
                  return {
                    response: problemResponse(402, "card-declined", "The card was declined.", {
                      operation: FAILED_NOT_APPLIED,
                    }),
                  };
                }
                return { data: { chargeId: charge.id } };
              },
            }),
        next: "charged",
      },
      charged: {
        // The charge it records: a settlement that resumes a key here must bring it (needs.ts).
        needs: ["chargeId"],
        local: async (ctx, tx) => {
          const chargeId = ctx.data.chargeId!;
          // The payment id is derived from the charge: one charge can never give two payment rows.
          const id = `pay_${chargeId.replace(/^ch_/, "")}`;
          const { rows } = await tx.query<Record<string, unknown>>(
            `INSERT INTO payments (id, account_id, amount_cents, currency, status, provider_ref, idempotency_key)
             VALUES ($1, $2, $3, $4, 'succeeded', $5, $6) RETURNING id, amount_cents, currency, status, created_at`,
            [id, ctx.scope, ctx.input.amount_cents, ctx.input.currency, ctx.idempotencyKey, ctx.key],
          );
          const payment = toPayment(rows[0]!);
          await writeOutbox(tx, {
            topic: "receipt-email",
            type: "payment.succeeded",
            aggregateType: "payment",
            aggregateId: id,
            payload: {
              payment: id,
              account: ctx.scope,
              charge: chargeId,
              amount_cents: payment.amount_cents,
            },
          });
          return {
            response: jsonResponse(201, { ...payment, charge: chargeId }, [
              ["location", `/v1/payments/${id}`],
            ]),
          };
        },
      },
    },
  });
}

/** The validated body as the runner's input: the card tokenized under `key` (`providerCard`). */
function toJob(key: string | undefined): MiddlewareHandler<Env> {
  return async function toJob(c, next) {
    const { card, ...payment } = c.var.body;
    c.set("payment", typeof card === "string" ? { ...payment, card: providerCard(card, key) } : payment);
    await next();
  };
}

/**
 * The payment routes in phases mode: `POST /v1/payments` (charged through the provider),
 * `GET /v1/payments` and `GET /v1/payments/:id`. A drop-in for payments.ts's `paymentRoutes`.
 */
export function paymentPhasesRoutes(deps: PaymentPhasesOptions & { db: Db; apiKeys: ApiKeys }): Hono<Env> {
  const app = new Hono<Env>();
  const runner = paymentPhasesRunner(deps);
  app.post(
    "/v1/payments",
    bodyLimit({
      maxSize: MAX_BODY_BYTES,
      onError: () => problem(413, "body-too-large", `The body is larger than ${MAX_BODY_BYTES} bytes.`),
    }),
    authenticate(deps.apiKeys),
    // Checked before the key is claimed: a bad request is answered 400/415 and saves nothing.
    validBody(PhasesPaymentRequest, { what: "payment", form: true }),
    toJob(deps.cardTokenKey),
    idempotentPhases<PaymentJob, Env>({
      runner,
      scope: (c) => c.var.accountId,
      input: (c) => c.var.payment,
      answerWithinMs: deps.answerWithinMs,
      authorizeReplay: replayAuthorized(deps.apiKeys),
      // A public route: each request's trace is its own, linked to the caller's, and no caller's
      // tracestate or baggage reaches the receipt event.
      traceContext: "link",
    }),
  );
  app.route("/", paymentReadRoutes(deps));
  return app;
}

/**
 * The runners of this service, for `idem complete --module app/payments-phases.ts`: the provider as the
 * service's configuration has it (app/config.ts: PROVIDER_URL, else the simulator on PROVIDER_PORT,
 * default http://127.0.0.1:4100; PROVIDER_IDEMPOTENCY).
 */
export function idemRunners(deps: { store: PostgresStore }): PhasesRunner<any, any>[] {
  const config = loadConfig(process.env);
  return [
    paymentPhasesRunner({
      store: deps.store,
      providerUrl: providerUrlOf(config),
      providerIdempotency: config.provider.idempotency,
    }),
  ];
}
