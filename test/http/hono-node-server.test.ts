/**
 * The Hono adapter's shortcuts on @hono/node-server (its lightweight Response and request): the handler
 * reads the body again through `c.req` as usual, and what is saved and sent is what the handler
 * answered, whatever shape its headers took. A store in memory records the saved reply.
 */
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { type Context, Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { AtomicStore, StoredResponse, Tx, WorkResult } from "../../src/core/index.ts";
import { type IdempotencyEnv, idempotency } from "../../src/http/hono.ts";

const saved: StoredResponse[] = [];
const store: AtomicStore<Tx> = {
  retentionMs: 60_000,
  lockTimeoutMs: 1_000,
  async atomic(_claim, work) {
    const r: WorkResult = await work({} as Tx);
    if (r.save) saved.push(r.save);
    return { kind: "executed", response: r.response, saved: !!r.save, expiresAt: new Date(), claimId: null };
  },
  transaction: (work) => work({} as Tx),
};

let url = "";
let close: () => void = () => {};

beforeAll(async () => {
  const app = new Hono<IdempotencyEnv>();
  const mw = idempotency({
    store,
    scope: () => "acct",
    replayHeaders: ["content-type", "x-a", "set-cookie"],
  });
  app.post("/json", mw, async (c: Context<IdempotencyEnv>) => {
    const json = await c.req.json();
    const text = await c.req.text();
    const bytes = new Uint8Array(await c.req.arrayBuffer());
    return c.json({ json, text, bytes: bytes.length, body: c.var.idempotency.body }, 201, { "X-A": "a" });
  });
  app.post("/cookies", mw, (c: Context<IdempotencyEnv>) => {
    c.header("set-cookie", "a=1", { append: true });
    c.header("set-cookie", "b=2", { append: true });
    return c.body("ok", 200, { "content-type": "text/plain" });
  });
  app.post("/bytes", mw, (c: Context<IdempotencyEnv>) => c.body(new Uint8Array([1, 2, 3]), 200));
  const server = await new Promise<ReturnType<typeof serve>>((resolve) => {
    const s = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, () => resolve(s));
  });
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  close = () => server.close();
});
afterAll(() => close());

const post = (path: string, body: string, key: string) =>
  fetch(`${url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", "idempotency-key": key },
    body,
  });

describe("Hono on @hono/node-server", () => {
  it("lets the handler read the body again as JSON, text and bytes, the same the middleware read", async () => {
    const body = '{"b":1,"a":"é"}';
    const res = await post("/json", body, "k-json");
    expect(res.status).toBe(201);
    expect(res.headers.get("x-a")).toBe("a");
    expect(await res.json()).toEqual({
      json: { b: 1, a: "é" },
      text: body,
      bytes: Buffer.byteLength(body),
      body: { b: 1, a: "é" },
    });
    const s = saved.at(-1)!;
    expect(s.headers).toEqual([
      ["content-type", "application/json"],
      ["x-a", "a"],
    ]);
    expect(JSON.parse(Buffer.from(s.body).toString()).text).toBe(body);
  });

  it("lets the handler read a large body again too (decoded only when asked)", async () => {
    const body = JSON.stringify({ note: "é".repeat(20_000) }); // 40 KB of UTF-8
    const res = await post("/json", body, "k-json-large");
    expect(res.status).toBe(201);
    const got = await res.json();
    expect(got.text).toBe(body);
    expect(got.json).toEqual(JSON.parse(body));
    expect(got.bytes).toBe(Buffer.byteLength(body));
  });

  it("sends and saves each of two Set-Cookie headers once (never replayed, still sent)", async () => {
    const res = await post("/cookies", "{}", "k-cookies");
    expect(res.status).toBe(200);
    expect(res.headers.getSetCookie()).toEqual(["a=1", "b=2"]);
    expect(await res.text()).toBe("ok");
    expect(saved.at(-1)!.headers).toEqual([["content-type", "text/plain"]]);
  });

  it("saves a byte body with Response's default content type, as res.headers says", async () => {
    const res = await post("/bytes", "{}", "k-bytes");
    expect(res.status).toBe(200);
    expect([...new Uint8Array(await res.arrayBuffer())]).toEqual([1, 2, 3]);
    expect(saved.at(-1)!.body).toEqual(new Uint8Array([1, 2, 3]));
  });
});
