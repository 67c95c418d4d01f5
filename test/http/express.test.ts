/**
 * The Express 5 adapter: `idempotency(options)` middleware, the handler's response held back until commit.
 */
import { randomUUID } from "node:crypto";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import express, { type NextFunction, type Request, type RequestHandler, type Response } from "express";
import { describe, expect, it } from "vitest";
import { idempotency, idempotentPhases, keepRawBody } from "../../src/http/express.ts";
import { backends } from "../helpers/db.ts";
import {
  type AppParts,
  account,
  charge,
  INVALID_BODY,
  mayReplay,
  PHASED_ANSWER_WITHIN_MS,
  paymentOf,
  paymentsContract,
  useApp,
  validatePayment,
} from "./contract.ts";
import { lifecycleContract } from "./contract-lifecycle.ts";

const validate: RequestHandler = function validate(req, res, next) {
  const payment = validatePayment(req.body);
  if (typeof payment === "string") {
    res.status(400).type("application/problem+json").send(INVALID_BODY);
    return;
  }
  res.locals.payment = payment;
  next();
};

async function pay(req: Request, res: Response) {
  const { tx, scope, body } = req.idempotency;
  const r = await charge(tx, scope, body, (name) => req.get(name));
  res.status(r.status).location(r.location).cookie("session", r.cookie.split(/[=;]/)[1], { httpOnly: true });
  res.type("application/json").send(r.json);
}

function startExpress({ store, runner }: AppParts) {
  const app = express();
  const scope = (req: Request) => req.get("x-account");
  const authorizeReplay = (req: Request) => mayReplay((name) => req.get(name));
  const json = express.json({ verify: keepRawBody });
  app.post("/v1/payments", json, validate, idempotency({ store, scope, authorizeReplay }), pay);
  app.post(
    "/v1/phased",
    json,
    validate,
    idempotentPhases({
      runner,
      scope,
      authorizeReplay,
      input: (_req, body) => paymentOf(body),
      answerWithinMs: PHASED_ANSWER_WITHIN_MS,
    }),
  );
  app.post("/v1/tips", json, validate, idempotency({ store, scope, required: false }), pay);
  // the body parsed without its bytes (canonical JSON of req.body), and not parsed at all (read here)
  app.post("/v1/parsed", express.json(), validate, idempotency({ store, scope }), pay);
  app.post("/v1/unparsed", idempotency({ store, scope }), (req, res) => {
    res.status(201).json({ key: req.idempotency.key });
  });
  // Middleware that wrap res.end on the instance, before idempotency and after it (as on-headers does)
  const wrapEnd =
    (header: string): RequestHandler =>
    (_req, res, next) => {
      const end = res.end;
      let calls = 0;
      res.end = function (this: Response, ...args: unknown[]) {
        if (!this.headersSent) this.setHeader(header, String(++calls));
        return (end as (...a: unknown[]) => Response).apply(this, args);
      } as Response["end"];
      next();
    };
  app.post(
    "/v1/wrapped",
    json,
    wrapEnd("x-outer"),
    idempotency({ store, scope, replayHeaders: ["content-type", "x-inner"] }),
    wrapEnd("x-inner"),
    (req, res) => {
      res.status(201).json({ key: req.idempotency.key, at: Date.now() + Math.random() });
    },
  );
  // Only a wrapper after idempotency: the response is held through Express's prototype, and the wrapper
  // set on the instance while it was held is taken away before the answer goes out
  app.post(
    "/v1/wrapped-after",
    json,
    idempotency({ store, scope, replayHeaders: ["content-type", "x-inner"] }),
    wrapEnd("x-inner"),
    (req, res) => {
      res.status(201).json({ key: req.idempotency.key, at: Date.now() + Math.random() });
    },
  );
  // The bytes keepRawBody kept, as the handler reads them
  app.post("/v1/raw", json, idempotency({ store, scope }), (req, res) => {
    const raw = (req as Request & { rawBody?: Buffer }).rawBody;
    res.status(201).json({ raw: raw?.toString("utf8") });
  });
  // A mounted app: its responses' prototype is its own app.response, and an error it does not handle
  // is answered by this app's error handler, after the prototype was switched back to this app's
  const sub = express();
  sub.post("/pay", json, idempotency({ store, scope }), (req, res) => {
    res.status(201).json({ key: req.idempotency.key, at: Date.now() + Math.random() });
  });
  sub.post("/crash", json, idempotency({ store, scope }), () => {
    throw Object.assign(new Error("boom"), { status: 500 });
  });
  app.use("/v1/sub", sub);
  // Middleware before idempotency that stamps a header on every request (saved with the answer), and
  // another only when asked (not saved)
  let stamps = 0;
  app.post(
    "/v1/stamped",
    json,
    (req, res, next) => {
      res.setHeader("x-stamp", String(++stamps));
      if (req.get("x-extra")) res.setHeader("x-extra-now", "yes");
      next();
    },
    idempotency({ store, scope, replayHeaders: ["content-type", "x-stamp"] }),
    (req, res) => {
      res.status(201).json({ key: req.idempotency.key });
    },
  );
  app.use((err: { status?: number }, _req: Request, res: Response, _next: NextFunction) => {
    // body-parser's errors carry their status (400 for JSON that is not JSON); a crash is a 500
    res.status(err.status ?? 500).json({ type: "urn:test:crash" });
  });
  return new Promise<{ url: string; close(): Promise<void> }>((resolve) => {
    const server: Server = app.listen(0, "127.0.0.1", () => {
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

describe.each(backends)("Express adapter on $name", (backend) => {
  const app = useApp(backend, startExpress);
  paymentsContract(app, { hangUp: true });
  lifecycleContract(app);

  it("fingerprints a body parsed without keepRawBody by its value", async () => {
    const acct = account();
    const key = randomUUID();
    const first = await app.post("/v1/parsed", {
      account: acct,
      key,
      body: '{"amount_cents":5000,"currency":"eur"}',
    });
    expect(first.status).toBe(201);
    const same = await app.post("/v1/parsed", {
      account: acct,
      key,
      body: '{"currency":"eur","amount_cents":5000}',
    });
    expect(same.headers.get("idempotent-replayed")).toBe("true");
    const other = await app.post("/v1/parsed", {
      account: acct,
      key,
      body: { amount_cents: 1, currency: "eur" },
    });
    expect(other.status).toBe(422);
    expect(await app.rows(acct)).toBe(1);
  });

  it("reads and fingerprints the body itself when no parser ran", async () => {
    const acct = account();
    const key = randomUUID();
    const headers = { "content-type": "text/plain" };
    const first = await app.post("/v1/unparsed", { account: acct, key, body: "one", headers });
    expect(first.status).toBe(201);
    const same = await app.post("/v1/unparsed", { account: acct, key, body: "one", headers });
    expect(same.headers.get("idempotent-replayed")).toBe("true");
    const other = await app.post("/v1/unparsed", { account: acct, key, body: "two", headers });
    expect(other.status).toBe(422);
    // labelled JSON but not JSON: refused before anything is claimed
    const notJson = await app.post("/v1/unparsed", { account: acct, key: randomUUID(), body: "one" });
    expect(notJson.status).toBe(400);
    expect(await notJson.json()).toMatchObject({ type: "urn:idem:problem:invalid-body" });
  });

  it("sends through the res.end wrappers in place before it, once, and saves what later ones set", async () => {
    const acct = account();
    const key = randomUUID();
    const first = await app.post("/v1/wrapped", { account: acct, key });
    expect(first.status).toBe(201);
    expect(first.headers.get("x-outer")).toBe("1");
    expect(first.headers.get("x-inner")).toBe("1");
    const sent = await first.json();
    const retry = await app.post("/v1/wrapped", { account: acct, key });
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(retry.headers.get("x-outer")).toBe("1");
    expect(retry.headers.get("x-inner")).toBe("1");
    expect(await retry.json()).toEqual(sent);
  });

  it("sends through a res.end wrapper set after it once, and replays what it set", async () => {
    const acct = account();
    const key = randomUUID();
    const first = await app.post("/v1/wrapped-after", { account: acct, key });
    expect(first.status).toBe(201);
    expect(first.headers.get("x-inner")).toBe("1");
    const sent = await first.json();
    const retry = await app.post("/v1/wrapped-after", { account: acct, key });
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(retry.headers.get("x-inner")).toBe("1");
    expect(await retry.json()).toEqual(sent);
  });

  it("keeps the body's bytes in req.rawBody for the handler, as sent", async () => {
    const body = '{ "amount_cents": 5000,  "currency": "eur" }';
    const r = await app.post("/v1/raw", { account: account(), key: randomUUID(), body });
    expect(r.status).toBe(201);
    expect((await r.json()).raw).toBe(body);
  });

  it("holds the answer of a mounted app, and of the error handler of the app it is mounted in", async () => {
    const acct = account();
    const key = randomUUID();
    const first = await app.post("/v1/sub/pay", { account: acct, key });
    expect(first.status).toBe(201);
    const sent = await first.text();
    const retry = await app.post("/v1/sub/pay", { account: acct, key });
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(await retry.text()).toBe(sent);
    // The parent's error handler answers 500 through the held response: not final, nothing saved, so
    // the same key runs again (and is answered the same way), never replayed or left in flight
    for (let i = 0; i < 2; i++) {
      const crash = await app.post("/v1/sub/crash", { account: acct, key: `${key}-crash` });
      expect(crash.status).toBe(500);
      expect(crash.headers.get("idempotent-replayed")).toBeNull();
      expect(await crash.json()).toEqual({ type: "urn:test:crash" });
    }
  });

  it("replays the saved headers only, not what middleware before it set on the retry", async () => {
    const acct = account();
    const key = randomUUID();
    const first = await app.post("/v1/stamped", { account: acct, key });
    expect(first.status).toBe(201);
    const stamp = first.headers.get("x-stamp");
    expect(first.headers.get("x-extra-now")).toBeNull();
    const retry = await app.post("/v1/stamped", { account: acct, key, headers: { "x-extra": "1" } });
    expect(retry.status).toBe(201);
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(retry.headers.get("x-stamp")).toBe(stamp);
    expect(retry.headers.get("x-extra-now")).toBeNull();
    expect(await retry.json()).toEqual({ key });
  });
});
