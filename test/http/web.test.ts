import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { describe } from "vitest";
import { InvalidBodyError } from "../../src/core/index.ts";
import { idempotency, idempotentPhases, type WebIdempotentHandler } from "../../src/http/web.ts";
import { backends } from "../helpers/db.ts";
import {
  type AppParts,
  charge,
  INVALID_BODY,
  mayReplay,
  PHASED_ANSWER_WITHIN_MS,
  paymentsContract,
  useApp,
  validatePayment,
} from "./contract.ts";
import { lifecycleContract, ownBodyContract } from "./contract-lifecycle.ts";

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

const crashes: unknown[] = [];

function startWeb({ store, runner }: AppParts) {
  const scope = (request: Request) => request.headers.get("x-account") ?? undefined;
  const onError = (err: unknown) => crashes.push(err);
  const authorizeReplay = (request: Request) => mayReplay((name) => request.headers.get(name) ?? undefined);
  const routes: Record<string, (request: Request, context: unknown) => Promise<Response>> = {
    "/v1/payments": idempotency(pay, { store, scope, onError, authorizeReplay }),
    "/v1/phased": idempotentPhases({
      runner,
      scope,
      onError,
      authorizeReplay,
      input: (_request, body) => {
        const p = validatePayment(body);
        if (typeof p === "string") throw new InvalidBodyError(p);
        return p;
      },
      answerWithinMs: PHASED_ANSWER_WITHIN_MS,
    }),
    "/v1/tips": idempotency(pay, { store, scope, onError, required: false }),
    "/v1/small": idempotency(pay, { store, scope, onError, limit: 64 }),
  };
  return new Promise<{ url: string; close(): Promise<void> }>((resolve) => {
    const server = serve(
      {
        fetch: (request: Request) => {
          const route = routes[new URL(request.url).pathname];
          return route ? route(request, {}) : new Response(null, { status: 404 });
        },
        port: 0,
        hostname: "127.0.0.1",
      },
      (info: AddressInfo) =>
        resolve({
          url: `http://127.0.0.1:${info.port}`,
          close: () =>
            new Promise<void>((done) => {
              server.close(() => done());
              (server as unknown as { closeAllConnections?(): void }).closeAllConnections?.();
            }),
        }),
    );
  });
}

describe.each(backends)("Web-standard adapter on $name", (backend) => {
  const app = useApp(backend, startWeb);
  paymentsContract(app, { hangUp: true });
  lifecycleContract(app);

  ownBodyContract(app, crashes);
});
