/**
 * The plain node:http adapter: `idempotent(handler, options)` as a request listener.
 */
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { describe, expect, it } from "vitest";
import { InvalidBodyError } from "../../src/core/index.ts";
import { idempotent, idempotentPhases, type NodeIdempotentHandler } from "../../src/http/node.ts";
import { backends } from "../helpers/db.ts";
import {
  type AppParts,
  account,
  charge,
  INVALID_BODY,
  mayReplay,
  PHASED_ANSWER_WITHIN_MS,
  paymentsContract,
  useApp,
  validatePayment,
} from "./contract.ts";
import { lifecycleContract } from "./contract-lifecycle.ts";

/** Plain node has no middleware chain: the handler validates first and answers 400 (not saved). */
const pay: NodeIdempotentHandler = async (req, { tx, scope, body }) => {
  if (typeof validatePayment(body) === "string") {
    return { status: 400, headers: { "content-type": "application/problem+json" }, body: INVALID_BODY };
  }
  const r = await charge(tx, scope, body, (name) => req.headers[name] as string | undefined);
  return {
    status: r.status,
    headers: { "content-type": "application/json", location: r.location, "set-cookie": [r.cookie] },
    body: r.json,
  };
};

const crashes: unknown[] = [];

function startNode({ store, runner }: AppParts) {
  const scope = (req: IncomingMessage) => req.headers["x-account"] as string | undefined;
  const onError = (err: unknown) => crashes.push(err);
  const authorizeReplay = (req: IncomingMessage) =>
    mayReplay((name) => req.headers[name] as string | undefined);
  const routes: Record<string, (req: IncomingMessage, res: ServerResponse) => void> = {
    "/v1/payments": idempotent(pay, { store, scope, onError, authorizeReplay }),
    "/v1/phased": idempotentPhases({
      runner,
      scope,
      onError,
      authorizeReplay,
      // Plain node has no middleware chain: validation is the input function (400 before any claim).
      input: (_req, body) => {
        const p = validatePayment(body);
        if (typeof p === "string") throw new InvalidBodyError(p);
        return p;
      },
      answerWithinMs: PHASED_ANSWER_WITHIN_MS,
    }),
    "/v1/tips": idempotent(pay, { store, scope, onError, required: false }),
    "/v1/small": idempotent(pay, { store, scope, onError, limit: 64 }),
  };
  const server = createServer((req, res) => {
    const route = routes[req.url ?? ""];
    if (route) return route(req, res);
    res.statusCode = 404;
    res.end();
  });
  return new Promise<{ url: string; close(): Promise<void> }>((resolve) => {
    server.listen(0, "127.0.0.1", () => {
      resolve({
        url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done());
            server.closeAllConnections();
          }),
      });
    });
  });
}

describe.each(backends)("node:http adapter on $name", (backend) => {
  const app = useApp(backend, startNode);
  paymentsContract(app, { hangUp: true });
  lifecycleContract(app);

  it("hands the handler's error to onError and answers 500 problem+json", async () => {
    crashes.length = 0;
    const res = await app.post("/v1/payments", {
      account: account(),
      key: randomUUID(),
      headers: { "x-crash": "1" },
    });
    expect(res.status).toBe(500);
    expect(res.headers.get("content-type")).toBe("application/problem+json");
    expect(crashes).toEqual([expect.objectContaining({ message: "the handler crashed after its insert" })]);
  });

  it("answers a body over the limit 413 problem+json and saves nothing", async () => {
    const acct = account();
    const res = await app.post("/v1/small", {
      account: acct,
      key: randomUUID(),
      body: { amount_cents: 5000, currency: "eur", note: "x".repeat(200) },
    });
    expect(res.status).toBe(413);
    expect(await res.json()).toMatchObject({ type: "urn:idem:problem:body-too-large", status: 413 });
    expect(await app.rows(acct)).toBe(0);
    expect(await app.keys(acct)).toBe(0);
  });
});
