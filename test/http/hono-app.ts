/**
 * The contract's payments app on Hono (the reference the other adapters mirror), served with
 * @hono/node-server: used by test/http/hono.test.ts and by the suites that run it through other parts
 * (test/production/pgbouncer.slow.test.ts).
 */
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { type Context, Hono, type MiddlewareHandler } from "hono";
import { IdemError, readRequestBody } from "../../src/core/index.ts";
import { type IdempotencyEnv, idempotency, idempotentPhases } from "../../src/http/hono.ts";
import {
  type AppParts,
  charge,
  INVALID_BODY,
  mayReplay,
  type PaymentInput,
  PHASED_ANSWER_WITHIN_MS,
  paymentOf,
  validatePayment,
} from "./contract.ts";

type Env = { Variables: { payment: PaymentInput } };

/**
 * Validation reads the body the way idem will (by its Content-Type), so both see the same value. A body
 * idem refuses (ambiguous, not JSON) is left for idem to answer.
 */
const validate: MiddlewareHandler<Env> = async function validate(c, next) {
  let parsed: unknown;
  try {
    parsed = readRequestBody(c.req.header("content-type"), new Uint8Array(await c.req.arrayBuffer())).value;
  } catch (err) {
    if (err instanceof IdemError) return next();
    throw err;
  }
  const payment = validatePayment(parsed);
  if (typeof payment === "string") {
    return c.body(INVALID_BODY, 400, { "content-type": "application/problem+json" });
  }
  c.set("payment", payment);
  await next();
};

async function pay(c: Context<IdempotencyEnv>) {
  const { tx, scope, body } = c.var.idempotency;
  const r = await charge(tx, scope, body, (name) => c.req.header(name));
  return c.body(r.json, r.status as 201, {
    "content-type": "application/json",
    location: r.location,
    "set-cookie": r.cookie,
  });
}

export function startHono({ store, runner }: AppParts) {
  const app = new Hono<Env>();
  const scope = (c: Context) => c.req.header("x-account");
  const authorizeReplay = (c: Context) => mayReplay((name) => c.req.header(name));
  app.post("/v1/payments", validate, idempotency({ store, scope, authorizeReplay }), pay);
  app.post("/v1/tips", validate, idempotency({ store, scope, required: false }), pay);
  app.post(
    "/v1/phased",
    validate,
    idempotentPhases({
      runner,
      scope,
      authorizeReplay,
      input: (_c, body) => paymentOf(body),
      answerWithinMs: PHASED_ANSWER_WITHIN_MS,
    }),
  );
  app.onError((_err, c) => c.json({ type: "urn:test:crash" }, 500));
  return new Promise<{ url: string; close(): Promise<void> }>((resolve) => {
    const server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, (info: AddressInfo) => {
      resolve({
        url: `http://127.0.0.1:${info.port}`,
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done());
            (server as import("node:http").Server).closeAllConnections?.();
          }),
      });
    });
  });
}
