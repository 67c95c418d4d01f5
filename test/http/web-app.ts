/**
 * The contract's payments app on the Web-standard adapter (idem/web): its routes as Fetch API handlers.
 * Built the same way by test/http/web.test.ts (on Node) and by the runtimes' servers (Bun, Deno,
 * workerd: test/runtimes/serve.ts), so each runtime runs the one app the contract suite expects.
 */
import { idempotency, idempotentPhases, type WebIdempotentHandler } from "../../src/http/web.ts";
import type { PostgresStore } from "../../src/postgres/store.ts";
import {
  charge,
  INVALID_BODY,
  mayReplay,
  type PaymentsRunner,
  PHASED_ANSWER_WITHIN_MS,
  phasedInput,
  validatePayment,
} from "./contract-app.ts";

/** A route handler as users write them: validate, write, answer with `Response`. */
const pay: WebIdempotentHandler<unknown, unknown, false> = async (request, { tx, scope, body }) => {
  if (typeof validatePayment(body) === "string") {
    return new Response(INVALID_BODY, {
      status: 400,
      headers: { "content-type": "application/problem+json" },
    });
  }
  // The request's body is still readable, and is the one idem fingerprinted.
  const again = await request.json();
  if (JSON.stringify(again) !== JSON.stringify(body)) throw new Error("the body read again differs");
  const r = await charge(tx, scope, body, (name) => request.headers.get(name) ?? undefined);
  const headers = new Headers({ "content-type": "application/json", location: r.location });
  headers.append("set-cookie", r.cookie);
  return new Response(r.json, { status: r.status, headers });
};

export type WebRoutes = Record<string, (request: Request, context: unknown) => Promise<Response>>;

/** The contract's routes; `onError` gets what a handler threw. */
export function webRoutes(
  { store, runner }: { store: PostgresStore; runner: PaymentsRunner },
  onError: (err: unknown) => void,
): WebRoutes {
  const scope = (request: Request) => request.headers.get("x-account") ?? undefined;
  const authorizeReplay = (request: Request) => mayReplay((name) => request.headers.get(name) ?? undefined);
  return {
    "/v1/payments": idempotency(pay, { store, scope, onError, authorizeReplay }),
    "/v1/phased": idempotentPhases({
      runner,
      scope,
      onError,
      authorizeReplay,
      input: phasedInput,
      answerWithinMs: PHASED_ANSWER_WITHIN_MS,
    }),
    "/v1/tips": idempotency(pay, { store, scope, onError, required: false }),
    "/v1/small": idempotency(pay, { store, scope, onError, limit: 64 }),
  };
}

/** Serve the routes by path (404 elsewhere). */
export function dispatch(routes: WebRoutes): (request: Request) => Promise<Response> {
  return async (request) => {
    const route = routes[new URL(request.url).pathname];
    return route ? route(request, {}) : new Response(null, { status: 404 });
  };
}
