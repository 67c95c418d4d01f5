/**
 * Home-region routing on its own (no database): what is forwarded, what it carries, and the clear
 * retryable error when the home region does not answer. Two Hono services on loopback.
 */
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { type Context, Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forwardedThrough, HomeRegionRouter } from "../../src/http/home-region.ts";
import { homeRegion } from "../../src/http/hono-home-region.ts";

interface Seen {
  region: string;
  method: string;
  path: string;
  body: string;
  headers: Record<string, string>;
}

function listen(app: Hono): Promise<{ url: string; close(): Promise<void> }> {
  return new Promise((resolve) => {
    const server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, (info: AddressInfo) => {
      resolve({
        url: `http://127.0.0.1:${info.port}`,
        close: () =>
          new Promise<void>((done) => {
            (server as import("node:http").Server).closeAllConnections?.();
            server.close(() => done());
          }),
      });
    });
  });
}

/** The account is the bearer token; "acct_us" lives in us, "acct_eu" in eu, others have no home. */
const scope = (c: Context) => /^Bearer (\S+)$/.exec(c.req.header("authorization") ?? "")?.[1];
const HOMES: Record<string, string> = { acct_eu: "eu", acct_us: "us" };

describe("home-region routing", () => {
  const seen: Seen[] = [];
  const targets: Record<string, string> = {};
  const services: Array<{ close(): Promise<void> }> = [];
  let eu: string;

  function region(name: string, slow = false): Hono {
    const app = new Hono();
    app.use(
      "*",
      homeRegion({ region: name, homeOf: (a) => HOMES[a], targets, scope, timeoutMs: slow ? 300 : 5_000 }),
    );
    app.all("*", async (c) => {
      const url = new URL(c.req.url);
      seen.push({
        region: name,
        method: c.req.method,
        path: url.pathname + url.search,
        body: await c.req.text(),
        headers: Object.fromEntries(c.req.raw.headers),
      });
      return c.json({ processed_in: name }, 201, {
        location: "/v1/payments/pay_1",
        "set-cookie": "session=abc",
        "idempotent-replayed": "true",
      });
    });
    return app;
  }

  beforeAll(async () => {
    for (const name of ["eu", "us"]) {
      const s = await listen(region(name));
      services.push(s);
      targets[name] = s.url;
    }
    eu = targets.eu!;
    // A region whose address accepts no connection (a listener closed at once).
    const gone = await listen(new Hono());
    await gone.close();
    targets.ap = gone.url;
    HOMES.acct_ap = "ap";
    // A region that takes its time: its service answers after 2 s.
    const slowApp = new Hono();
    slowApp.all("*", async (c) => {
      await new Promise((r) => setTimeout(r, 2_000));
      return c.text("late");
    });
    const slow = await listen(slowApp);
    services.push(slow);
    targets.slow = slow.url;
    HOMES.acct_slow = "slow";
  });
  afterAll(async () => {
    for (const s of services) await s.close();
  });

  const post = (base: string, account: string, extra: Record<string, string> = {}) =>
    fetch(`${base}/v1/payments?expand=customer`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${account}`,
        "idempotency-key": '"k-123"',
        "content-type": "application/json",
        "x-request-id": "req-1",
        ...extra,
      },
      body: '{"amount_cents":5000}',
    });

  it("processes a home account's request where it lands", async () => {
    seen.length = 0;
    const res = await post(eu, "acct_eu");
    expect(await res.json()).toEqual({ processed_in: "eu" });
    expect(seen.map((s) => s.region)).toEqual(["eu"]);
    expect(res.headers.get("via")).toBeNull();
  });

  it("forwards another region's account with its method, path, body, key and credentials", async () => {
    seen.length = 0;
    const res = await post(eu, "acct_us");
    expect(res.status).toBe(201);
    expect(await res.json()).toEqual({ processed_in: "us" });
    expect(seen).toHaveLength(1);
    const got = seen[0]!;
    expect(got).toMatchObject({
      region: "us",
      method: "POST",
      path: "/v1/payments?expand=customer",
      body: '{"amount_cents":5000}',
    });
    expect(got.headers["idempotency-key"]).toBe('"k-123"');
    expect(got.headers.authorization).toBe("Bearer acct_us");
    expect(got.headers["x-request-id"]).toBe("req-1");
    expect(got.headers.via).toBe("1.1 idem-eu");
    expect(got.headers.forwarded).toMatch(/^proto=http;host="127\.0\.0\.1:\d+"$/);
    // The home region's reply comes back as it was, marked as having passed through eu.
    expect(res.headers.get("location")).toBe("/v1/payments/pay_1");
    expect(res.headers.get("idempotent-replayed")).toBe("true");
    expect(res.headers.get("via")).toBe("1.1 idem-eu");
  });

  it("serves reads where they land unless told otherwise", async () => {
    seen.length = 0;
    const res = await fetch(`${eu}/v1/payments`, { headers: { authorization: "Bearer acct_us" } });
    expect(await res.json()).toEqual({ processed_in: "eu" });
    const all = new HomeRegionRouter({ region: "eu", homeOf: (a) => HOMES[a], targets, methods: "all" });
    expect(await all.decide("acct_us", "GET")).toEqual({ kind: "forward", region: "us", target: targets.us });
  });

  it("serves accounts without a home region, and unauthenticated requests, locally", async () => {
    seen.length = 0;
    await post(eu, "acct_nowhere");
    await fetch(`${eu}/v1/payments`, { method: "POST", body: "{}" });
    expect(seen.map((s) => s.region)).toEqual(["eu", "eu"]);
  });

  it("answers 503 home-region-unreachable with Retry-After, and processes nothing, when the home is down", async () => {
    seen.length = 0;
    const res = await post(eu, "acct_ap");
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBe("1");
    expect(res.headers.get("content-type")).toBe("application/problem+json");
    expect(await res.json()).toMatchObject({
      type: "urn:idem:problem:home-region-unreachable",
      status: 503,
      home_region: "ap",
      region: "eu",
      reason: "network",
    });
    expect(seen).toEqual([]);
  });

  it("gives up on a home region that does not answer in time", async () => {
    const slowEu = await listen(region("eu", true));
    services.push(slowEu);
    const started = Date.now();
    const res = await post(slowEu.url, "acct_slow");
    expect(res.status).toBe(503);
    expect(await res.json()).toMatchObject({ reason: "timeout", home_region: "slow" });
    expect(Date.now() - started).toBeLessThan(1_800);
  });

  it("answers 503 for a home region without an address", async () => {
    HOMES.acct_mars = "mars";
    const res = await post(eu, "acct_mars");
    expect(res.status).toBe(503);
    expect(await res.json()).toMatchObject({ reason: "no-target", home_region: "mars" });
  });

  it("never forwards twice: regions that disagree on the home answer 503 home-region-loop", async () => {
    seen.length = 0;
    // us forwarded this request to eu, yet eu's map says acct_us lives in us: the two maps disagree
    // (say, while the account moves). eu must neither send it back nor process it.
    const res = await post(eu, "acct_us", { via: "1.1 idem-us" });
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBe("1");
    expect(await res.json()).toMatchObject({ type: "urn:idem:problem:home-region-loop", home_region: "us" });
    expect(seen).toEqual([]);
  });

  it("reads idem's own Via entries only", () => {
    expect(forwardedThrough("1.1 idem-eu")).toEqual(["eu"]);
    expect(forwardedThrough("1.0 fred, 1.1 p.example.net, HTTP/1.1 idem-us-east.1")).toEqual(["us-east.1"]);
    expect(forwardedThrough("1.1 varnish")).toEqual([]);
    expect(forwardedThrough(undefined)).toEqual([]);
  });
});
