/**
 * The tiny payments app every adapter's contract test builds (contract.ts): validation, the handler's
 * work, and the phases runner of `/v1/phased`. Free of vitest and of Node-only modules, so that the
 * runtimes' servers (Bun, Deno, workerd: test/runtimes/) build the very same app.
 */
import { randomBytes } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { InvalidBodyError, OperationUncertainError, type Tx } from "../../src/core/index.ts";
import { definePhases, jsonResponse, type PhasesRunner } from "../../src/postgres/index.ts";
import type { PostgresStore } from "../../src/postgres/store.ts";

export interface PaymentInput {
  amount_cents: number;
  currency: string;
}

/** Validation, run before the idempotency middleware: a string is the reason the body is refused. */
export function validatePayment(body: unknown): PaymentInput | string {
  if (body === null || typeof body !== "object") return "the body must be a JSON object";
  const { amount_cents, currency } = body as Record<string, unknown>;
  if (typeof amount_cents !== "number" || !Number.isInteger(amount_cents) || amount_cents <= 0) {
    return "amount_cents must be a positive whole number";
  }
  if (typeof currency !== "string" || !/^[a-z]{3}$/.test(currency)) return "currency must be like eur";
  return { amount_cents, currency };
}

export const INVALID_BODY = JSON.stringify({
  type: "urn:test:invalid-body",
  title: "Bad Request",
  status: 400,
});

/** The input of `/v1/phased` from the body, or 400 before anything is claimed (as validation would). */
export function phasedInput(_request: unknown, body: unknown): PaymentInput {
  const p = validatePayment(body);
  if (typeof p === "string") throw new InvalidBodyError(p);
  return p;
}

/** The validated payment of a body that validation already passed (the handler's own reading of it). */
export function paymentOf(body: unknown): PaymentInput {
  const p = validatePayment(body);
  if (typeof p === "string") throw new Error(`the handler got a body validation refused: ${p}`);
  return p;
}

/** What the payments handler answers; each app sends it with its framework's own response API. */
export interface PaymentReply {
  status: number;
  location: string;
  cookie: string;
  json: string;
}

/** The handler's work, in the request's transaction. */
export async function charge(
  tx: Tx,
  account: string | undefined,
  body: unknown,
  header: (name: string) => string | undefined,
): Promise<PaymentReply> {
  if (account === undefined) {
    // standing in for authentication: an optional-key route called without an account
    return {
      status: 401,
      location: "/",
      cookie: "session=; Path=/",
      json: '{"type":"urn:test:unauthenticated"}',
    };
  }
  const input = paymentOf(body);
  const { rows } = await tx.query<{ id: number }>(
    "INSERT INTO payments (account, amount_cents, currency) VALUES ($1, $2, $3) RETURNING id",
    [account, input.amount_cents, input.currency],
  );
  const id = rows[0]!.id;
  const wait = Number(header("x-sleep-ms") ?? 0);
  if (wait > 0) await sleep(wait);
  if (header("x-crash")) throw new Error("the handler crashed after its insert");
  return {
    status: Number(header("x-status") ?? 201),
    location: `/v1/payments/${id}`,
    cookie: `session=${randomBytes(8).toString("hex")}; Path=/; HttpOnly`,
    // a fresh receipt on every execution: a replay that ran the handler again would show
    json: JSON.stringify({ id, account, ...input, receipt: randomBytes(8).toString("hex") }),
  };
}

/** Whether a request may still see a saved answer (`authorizeReplay` of `/v1/payments` and `/v1/phased`). */
export const mayReplay = (header: (name: string) => string | undefined) => !header("x-revoked");

/** An amount whose "provider call" on `/v1/phased` ends with an unknown outcome (operation-uncertain). */
export const UNCERTAIN_AMOUNT = 13;

/** The phases answer bound of `/v1/phased`, in ms (published as 2 s). */
export const PHASED_ANSWER_WITHIN_MS = 2_000;

/**
 * `/v1/phased`: an "external" phase (it records the call in `external_calls`, keyed by our key, as a
 * provider would) then a local one that inserts the payment.
 */
export function phasesRunner(
  store: PostgresStore,
  name = `contract-${randomBytes(4).toString("hex")}`,
): PaymentsRunner {
  return definePhases<PaymentInput, { charge: string }>({
    store,
    name,
    phases: {
      started: {
        external: async (ctx) => {
          if (ctx.input.amount_cents === UNCERTAIN_AMOUNT) {
            throw new OperationUncertainError(ctx.operationRef);
          }
          await store.db.query(
            "INSERT INTO external_calls (key, amount_cents) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
            [ctx.idempotencyKey, ctx.input.amount_cents],
          );
          return { data: { charge: `ch_${ctx.idempotencyKey}` } };
        },
        next: "charged",
      },
      charged: {
        local: async (ctx, tx) => {
          const { rows } = await tx.query<{ id: number }>(
            "INSERT INTO payments (account, amount_cents, currency) VALUES ($1, $2, $3) RETURNING id",
            [ctx.scope, ctx.input.amount_cents, ctx.input.currency],
          );
          const id = rows[0]!.id;
          return {
            response: jsonResponse(201, { id, ...ctx.input, receipt: randomBytes(8).toString("hex") }, [
              ["location", `/v1/payments/${id}`],
            ]),
          };
        },
      },
    },
  });
}

/** The phases runner of `/v1/phased`. */
export type PaymentsRunner = PhasesRunner<PaymentInput, { charge: string }>;
