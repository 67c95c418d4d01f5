/**
 * The client asks before it resends (issue 34): against the reference service on PostgreSQL, behind a
 * proxy that counts every request and loses replies on purpose, a client whose reply was lost learns
 * the outcome with ONE `GET /v1/operations` and never sends the payment again.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import {
  createClient,
  IntentStatus,
  isOperationUncertainError,
  MemoryIntentStore,
} from "../../src/client/index.ts";
import { KEY_1, type RunningService, startService } from "../app/service.ts";
import { backends } from "../helpers/db.ts";

const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;

/** A proxy in front of the service: counts requests by "METHOD /path", and loses what it is told to. */
interface Proxy {
  url: string;
  counts: Map<string, number>;
  /** The next POST: `after` its reply came back (processed, reply lost), or `before` it is forwarded. */
  lose: "after" | "before" | undefined;
  server: Server;
}

async function startProxy(upstream: string): Promise<Proxy> {
  const proxy: Proxy = { url: "", counts: new Map(), lose: undefined, server: undefined as never };
  proxy.server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", async () => {
      const name = `${req.method} ${new URL(req.url!, "http://x").pathname}`;
      proxy.counts.set(name, (proxy.counts.get(name) ?? 0) + 1);
      const lose = req.method === "POST" ? proxy.lose : undefined;
      if (lose) proxy.lose = undefined;
      if (lose === "before") return req.socket.destroy();
      const headers: Record<string, string> = {};
      for (const [k, v] of Object.entries(req.headers)) {
        if (typeof v === "string" && k !== "host" && k !== "connection") headers[k] = v;
      }
      const up = await fetch(upstream + req.url, {
        method: req.method,
        headers,
        body: chunks.length ? Buffer.concat(chunks) : undefined,
      });
      const body = Buffer.from(await up.arrayBuffer());
      if (lose === "after") return req.socket.destroy(); // the service did the work; its reply is lost
      const out: Record<string, string> = {};
      up.headers.forEach((v, k) => {
        if (k !== "content-length" && k !== "transfer-encoding" && k !== "connection") out[k] = v;
      });
      res.writeHead(up.status, out);
      res.end(body);
    });
  });
  await new Promise<void>((r) => proxy.server.listen(0, "127.0.0.1", r));
  proxy.url = `http://127.0.0.1:${(proxy.server.address() as AddressInfo).port}`;
  return proxy;
}

describe(`the client asks the operation lookup before resending (service on ${backend.name})`, () => {
  let svc: RunningService;
  let proxy: Proxy;
  beforeAll(async () => {
    svc = await startService(backend, { paymentsMode: "atomic" });
    proxy = await startProxy(svc.url);
  });
  afterAll(async () => {
    proxy?.server.closeAllConnections();
    await new Promise<void>((r) => (proxy ? proxy.server.close(() => r()) : r()));
    await svc?.stop();
  });
  beforeEach(() => {
    proxy.counts.clear();
  });

  // Each test pays an amount of its own: the payments made for it, counted at the service.
  const paymentsOf = (amount: number) =>
    svc.count("SELECT count(*)::int AS n FROM payments WHERE amount_cents = $1", [amount]);
  const clientOf = (store = new MemoryIntentStore(), operationsPath?: string) =>
    createClient({
      baseUrl: proxy.url,
      store,
      headers: { authorization: `Bearer ${KEY_1}` },
      maxAttempts: 1, // the lost reply ends the call: resume() is what follows
      ...(operationsPath !== undefined && { operationsPath }),
    });

  it("a reply lost after the payment was made: resume() is one GET, no POST, and the saved answer", async () => {
    const client = clientOf();
    // An earlier answer from this server carried Idempotency-Operation-Ref: it offers the lookup.
    expect((await client.post("/v1/payments", { amount_cents: 100, currency: "eur" })).status).toBe(201);
    proxy.lose = "after";
    await expect(
      client.post("/v1/payments", { amount_cents: 4200, currency: "eur" }, { intent: "checkout-1" }),
    ).rejects.toThrow();
    const intent = (await client.store.get("checkout-1"))!;
    expect(intent.status).toBe(IntentStatus.pending);
    proxy.counts.clear();

    const res = await client.resume("checkout-1");
    expect(res.status).toBe(201);
    expect(res.headers.get("idempotent-replayed")).toBe("true");
    expect(((await res.json()) as { amount_cents: number }).amount_cents).toBe(4200);
    expect(Object.fromEntries(proxy.counts)).toEqual({ "GET /v1/operations": 1 });
    expect(await paymentsOf(4200)).toBe(1);
    expect((await client.store.get("checkout-1"))?.status).toBe(IntentStatus.done);
  });

  it("status(intent) after a restart: the outcome in one GET, by key, without the body", async () => {
    const store = new MemoryIntentStore();
    const before = clientOf(store);
    proxy.lose = "after";
    await expect(
      before.post("/v1/payments", { amount_cents: 4300, currency: "eur" }, { intent: "checkout-2" }),
    ).rejects.toThrow();
    proxy.counts.clear();

    const after = clientOf(store); // a new process: it has seen no answer from the server
    const known = await after.status("checkout-2");
    expect(known).toMatchObject({ state: "done", finished: true });
    expect(known.response.status).toBe(201);
    expect(known.lookupUrl).toBe(`${proxy.url}/v1/operations`);
    expect(known.operationRef).toMatch(/^op_/);
    expect(Object.fromEntries(proxy.counts)).toEqual({ "GET /v1/operations": 1 });
    expect((await store.get("checkout-2"))?.status).toBe(IntentStatus.done);
  });

  it("a request that never reached the server: the lookup says unknown, then resume() sends it once", async () => {
    const client = clientOf(new MemoryIntentStore(), "/v1/operations"); // configured: always ask
    proxy.lose = "before";
    await expect(
      client.post("/v1/payments", { amount_cents: 4400, currency: "eur" }, { intent: "checkout-3" }),
    ).rejects.toThrow();
    expect(await paymentsOf(4400)).toBe(0);
    expect(await client.status("checkout-3")).toMatchObject({ state: "unknown", finished: false });
    proxy.counts.clear();

    const res = await client.resume("checkout-3");
    expect(res.status).toBe(201);
    expect(res.headers.get("idempotent-replayed")).toBeNull();
    expect(Object.fromEntries(proxy.counts)).toEqual({ "GET /v1/operations": 1, "POST /v1/payments": 1 });
    expect(await paymentsOf(4400)).toBe(1);
  });

  it("an intent the server called uncertain: resume() sends nothing and says where to look", async () => {
    const store = new MemoryIntentStore();
    const client = clientOf(store);
    const record = await client.intent("checkout-4");
    record.status = IntentStatus.uncertain;
    record.request = { method: "POST", url: `${proxy.url}/v1/payments`, headers: [] };
    record.lastAnswer = { status: 409, operationState: "uncertain", operationRef: "op_abc" };
    await store.save(record);
    const err = await client.resume("checkout-4").catch((e: unknown) => e);
    expect(isOperationUncertainError(err)).toBe(true);
    expect(err).toMatchObject({ operationRef: "op_abc", lookupUrl: `${proxy.url}/v1/operations/op_abc` });
    expect(proxy.counts.size).toBe(0);
  });
});

describe(`resume() while the payment is still being made (phases, 1.5 s charge, ${backend.name})`, () => {
  let svc: RunningService;
  let proxy: Proxy;
  beforeAll(async () => {
    svc = await startService(backend, { paymentsMode: "phases", providerLatencyMs: 1_500 });
    proxy = await startProxy(svc.url);
  });
  afterAll(async () => {
    proxy?.server.closeAllConnections();
    await new Promise<void>((r) => (proxy ? proxy.server.close(() => r()) : r()));
    await svc?.stop();
  });

  it("the lookup holds the GET until the charge ends: one GET, no POST, the 201", async () => {
    const client = createClient({
      baseUrl: proxy.url,
      headers: { authorization: `Bearer ${KEY_1}` },
      maxAttempts: 1,
      perTryTimeoutMs: 300, // the client stops waiting while the service charges
      operationsPath: "/v1/operations",
    });
    await expect(
      client.post("/v1/payments", { amount_cents: 4500, currency: "eur" }, { intent: "slow-1" }),
    ).rejects.toThrow();
    proxy.counts.clear();
    const t = performance.now();
    const res = await client.resume("slow-1");
    const ms = performance.now() - t;
    expect(res.status).toBe(201);
    expect(((await res.json()) as { amount_cents: number }).amount_cents).toBe(4500);
    expect(Object.fromEntries(proxy.counts)).toEqual({ "GET /v1/operations": 1 });
    expect(ms).toBeLessThan(4_000); // answered when the charge ended, within resume()'s 5 s wait
    expect(await svc.count("SELECT count(*)::int AS n FROM payments WHERE amount_cents = 4500")).toBe(1);
    console.log(`resume(): one GET held ${Math.round(ms)} ms until the charge ended`);
  });
});
