/**
 * Retry at one layer, fail fast everywhere else: a chain app -> gateway -> service over real HTTP, the
 * gateway's client with `failFast`. The service (the bottom) fails a few times; only the app retries,
 * so the bottom sees one call per app attempt, not attempts multiplied per layer, and the gateway's
 * answers carry what the app needs: the same key, the bottom's Retry-After, the operation's state.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import {
  createClient,
  isFailedFastError,
  isOperationUncertainError,
  PASSED_UP_PROBLEM,
  passUp,
} from "../../src/client/index.ts";

type Handler = (req: IncomingMessage, res: ServerResponse, body: string) => void | Promise<void>;
const servers: Server[] = [];

async function serve(handler: Handler): Promise<string> {
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => {
      body += c;
    });
    req.on("end", () => void handler(req, res, body));
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

/** A gateway: forwards the caller's key downstream through a fail-fast client, passes errors up. */
async function gateway(downstream: string, options: { failFast: boolean; maxAttempts?: number }) {
  const inner = createClient({
    failFast: options.failFast,
    maxAttempts: options.maxAttempts ?? 3,
    retry: { baseMs: 1, capMs: 2 },
    breaker: false,
  });
  const url = await serve(async (req, res, body) => {
    const key = String(req.headers["idempotency-key"]);
    try {
      const intent = await inner.intent(`gw:${key}`, { key });
      const answer = await inner.request(intent, `${downstream}/pay`, { method: "POST", body });
      res.writeHead(answer.status, { "content-type": answer.headers.get("content-type") ?? "text/plain" });
      res.end(await answer.text());
    } catch (err) {
      const up = passUp(err, { retryAfterSeconds: 0 });
      res.writeHead(up.status, Object.fromEntries(up.headers));
      res.end(await up.text());
    }
  });
  return { url, inner };
}

afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
});

describe("failFast and passUp: retry at one layer", () => {
  it("the bottom sees one call per outer attempt, all with the caller's key", async () => {
    const keys: string[] = [];
    let calls = 0;
    const bottom = await serve((req, res) => {
      keys.push(String(req.headers["idempotency-key"]));
      calls++;
      if (calls <= 2) {
        res.writeHead(503, { "retry-after": "0", "content-type": "text/plain" });
        res.end("database down");
        return;
      }
      res.writeHead(201, { "content-type": "application/json" });
      res.end('{"paid":true}');
    });
    const gw = await gateway(bottom, { failFast: true });
    const app = createClient({ maxAttempts: 3, retry: { baseMs: 1, capMs: 2 }, breaker: false });
    const res = await app.post(`${gw.url}/pay`, { amount: 1 });
    expect(res.status).toBe(201);
    expect(calls).toBe(3); // 3 app attempts -> 3 bottom calls (without failFast: up to 9)
    expect(new Set(keys).size).toBe(1);
    expect(gw.inner.budget).toBeUndefined(); // an inner layer spends no retry budget
  });

  it("without failFast the layers multiply: 3 x 3 calls reach a dead bottom for one tap", async () => {
    let calls = 0;
    const bottom = await serve((_req, res) => {
      calls++;
      res.writeHead(503, { "content-type": "text/plain" });
      res.end("down");
    });
    const gw = await gateway(bottom, { failFast: false });
    const app = createClient({
      maxAttempts: 3,
      retry: { baseMs: 1, capMs: 2 },
      breaker: false,
      budget: false,
    });
    await expect(app.post(`${gw.url}/pay`, {})).rejects.toMatchObject({ attempts: 3 });
    expect(calls).toBe(9);
  });

  it("passes up the bottom's Retry-After and state, as problem fields the outer client acts on", async () => {
    const bottom = await serve((_req, res) => {
      res.writeHead(409, {
        "content-type": "application/problem+json",
        "retry-after": "7",
      });
      res.end(
        JSON.stringify({
          type: "urn:idem:problem:idempotency-key-in-flight",
          status: 409,
          operation_state: "in_progress",
          operation_ref: "op_abc",
        }),
      );
    });
    const gw = await gateway(bottom, { failFast: true });
    const res = await fetch(`${gw.url}/pay`, {
      method: "POST",
      headers: { "idempotency-key": "k-1" },
      body: "{}",
    });
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBe("7");
    expect(res.headers.get("idempotency-operation-state")).toBe("in_progress");
    expect(await res.json()).toMatchObject({
      type: PASSED_UP_PROBLEM,
      retry_same_key: true,
      operation_state: "in_progress",
      operation_ref: "op_abc",
    });
  });

  it("a fail-fast client throws FailedFastError after one attempt; an unreachable dependency passes up 502", async () => {
    const inner = createClient({ failFast: true, breaker: false });
    const err = await inner.post("http://127.0.0.1:9/pay", {}).catch((e: unknown) => e);
    expect(isFailedFastError(err)).toBe(true);
    expect(err).toMatchObject({ attempts: 1 });
    const up = passUp(err);
    expect(up.status).toBe(502);
    expect(up.headers.get("retry-after")).toBe("1");
    expect(await up.json()).toMatchObject({ retry_same_key: true });
  });

  it("an uncertain operation is passed up as uncertain: the outer layer does not retry it", async () => {
    let calls = 0;
    const bottom = await serve((_req, res) => {
      calls++;
      res.writeHead(409, { "content-type": "application/problem+json" });
      res.end(
        JSON.stringify({
          type: "urn:idem:problem:operation-uncertain",
          status: 409,
          operation_state: "uncertain",
          retry_same_key: false,
          operation_ref: "op_u",
        }),
      );
    });
    const gw = await gateway(bottom, { failFast: true });
    const app = createClient({ maxAttempts: 3, retry: { baseMs: 1 }, breaker: false });
    const err = await app.post(`${gw.url}/pay`, {}).catch((e: unknown) => e);
    expect(isOperationUncertainError(err)).toBe(true);
    expect(calls).toBe(1);
  });
});
