import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { describe, expect, it } from "vitest";
import { InvalidBodyError } from "../../src/core/index.ts";
import { idempotency, idempotentPhases, type NodeIdempotentHandler } from "../../src/http/node.ts";
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

/** Plain node has no middleware chain: the handler validates first and answers 400 (not saved). */
const pay: NodeIdempotentHandler<unknown, false> = async (req, { tx, scope, body }) => {
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

/** A handler written as a plain function (JavaScript callers may), counting its runs. */
let plainRuns = 0;
const plain = ((_req: IncomingMessage, { key }: { key: string }) => {
  plainRuns++;
  return {
    status: 201,
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ key, run: plainRuns }),
  };
}) as unknown as NodeIdempotentHandler;

function startNode({ store, runner }: AppParts) {
  const scope = (req: IncomingMessage) => req.headers["x-account"] as string | undefined;
  const onError = (err: unknown) => crashes.push(err);
  const authorizeReplay = (req: IncomingMessage) =>
    mayReplay((name) => req.headers[name] as string | undefined);
  const routes: Record<string, (req: IncomingMessage, res: ServerResponse) => void> = {
    "/v1/payments": idempotency(pay, { store, scope, onError, authorizeReplay }),
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
    "/v1/tips": idempotency(pay, { store, scope, onError, required: false }),
    "/v1/small": idempotency(pay, { store, scope, onError, limit: 64 }),
    "/v1/plain": idempotency(plain, { store, scope, onError }),
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

  ownBodyContract(app, crashes);

  it("runs a handler written as a plain function once, and replays its answer byte for byte", async () => {
    const before = plainRuns;
    const first = await app.post("/v1/plain", { account: "acct_plain", key: `plain-${backend.name}` });
    const firstBody = await first.text();
    const again = await app.post("/v1/plain", { account: "acct_plain", key: `plain-${backend.name}` });
    expect(first.status).toBe(201);
    expect(again.status).toBe(201);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(await again.text()).toBe(firstBody);
    expect(plainRuns - before).toBe(1);
  });
});
