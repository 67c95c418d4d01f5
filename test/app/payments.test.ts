import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { backends } from "../helpers/db.ts";
import { KEY_2, pay, type RunningService, startService } from "./service.ts";

// The real server when DATABASE_URL is set (always in CI), else the embedded PGlite.
const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;

describe(`payments service on ${backend.name}`, () => {
  let svc: RunningService;
  beforeAll(async () => {
    svc = await startService(backend);
  });
  afterAll(async () => {
    await svc?.stop();
  });

  const payments = () => svc.count("SELECT count(*)::int AS n FROM payments");

  it("runs the spec's scenario: 8 replies (seven 201, one 422) and exactly two payments", async () => {
    const before = await payments();
    const k1 = randomUUID();
    const first = await pay(svc.url, { key: k1 });
    const firstBody = await first.text();
    const retry = await pay(svc.url, { key: k1 });
    const changed = await pay(svc.url, {
      key: k1,
      body: JSON.stringify({ amount_cents: 7000, currency: "eur" }),
    });
    const k2 = randomUUID();
    const five = await Promise.all(
      Array.from({ length: 5 }, () =>
        pay(svc.url, { key: k2, body: JSON.stringify({ amount_cents: 700, currency: "eur" }) }),
      ),
    );
    const statuses = [first, retry, changed, ...five].map((r) => r.status);
    expect(statuses.filter((s) => s === 201)).toHaveLength(7);
    expect(statuses.filter((s) => s === 422)).toHaveLength(1);
    expect(await retry.text()).toBe(firstBody);
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(first.headers.get("idempotent-replayed")).toBeNull();
    expect(changed.headers.get("content-type")).toBe("application/problem+json");
    expect(JSON.parse(await changed.text()).type).toBe("urn:idem:problem:idempotency-key-mismatch");
    const fiveBodies = new Set(await Promise.all(five.map((r) => r.text())));
    expect(fiveBodies.size).toBe(1);
    expect(five.filter((r) => r.headers.get("idempotent-replayed") === "true")).toHaveLength(4);
    expect((await payments()) - before).toBe(2);
  });

  it("answers 100 concurrent requests with one key with one execution and 100 identical bodies", async () => {
    const before = await payments();
    const key = randomUUID();
    const replies = await Promise.all(Array.from({ length: 100 }, () => pay(svc.url, { key })));
    expect(replies.map((r) => r.status)).toEqual(Array(100).fill(201));
    const bodies = new Set(await Promise.all(replies.map((r) => r.text())));
    expect(bodies.size).toBe(1);
    expect((await payments()) - before).toBe(1);
  });

  it("keeps two accounts with the same key apart: two payments, each replaying its own", async () => {
    const key = randomUUID();
    const a = await pay(svc.url, { key, body: JSON.stringify({ amount_cents: 111, currency: "eur" }) });
    const b = await pay(svc.url, {
      key,
      apiKey: KEY_2,
      body: JSON.stringify({ amount_cents: 111, currency: "eur" }),
    });
    expect([a.status, b.status]).toEqual([201, 201]);
    const pa = await a.json();
    const pb = await b.json();
    expect(pa.id).not.toBe(pb.id);
    const replayB = await pay(svc.url, {
      key,
      apiKey: KEY_2,
      body: JSON.stringify({ amount_cents: 111, currency: "eur" }),
    });
    expect((await replayB.json()).id).toBe(pb.id);
    // Neither account can read the other's payment.
    const cross = await fetch(`${svc.url}/v1/payments/${pa.id}`, {
      headers: { authorization: `Bearer ${KEY_2}` },
    });
    expect(cross.status).toBe(404);
    const own = await fetch(`${svc.url}/v1/payments/${pa.id}`, {
      headers: { authorization: "Bearer sk_test_demo_1" },
    });
    expect((await own.json()).id).toBe(pa.id);
  });

  it("accepts form bodies and quoted sf-string keys, and treats them as the same key as the bare token", async () => {
    const key = randomUUID();
    const form = "currency=eur&amount_cents=4200";
    const first = await pay(svc.url, { key, body: form, contentType: "application/x-www-form-urlencoded" });
    expect(first.status).toBe(201);
    const reordered = await pay(svc.url, {
      key: `"${key}"`,
      body: "amount_cents=4200&currency=eur",
      contentType: "application/x-www-form-urlencoded",
    });
    expect(reordered.status).toBe(201);
    expect(reordered.headers.get("idempotent-replayed")).toBe("true");
    expect(await reordered.text()).toBe(await first.text());
  });

  it("lists the caller's payments newest first", async () => {
    const k = randomUUID();
    const made = await (
      await pay(svc.url, { key: k, body: JSON.stringify({ amount_cents: 999, currency: "usd" }) })
    ).json();
    const list = await (
      await fetch(`${svc.url}/v1/payments`, { headers: { authorization: "Bearer sk_test_demo_1" } })
    ).json();
    expect(list.data[0]).toEqual(made);
  });

  it("publishes the retention window on keyed replies", async () => {
    const r = await pay(svc.url, { key: randomUUID() });
    const expires = Date.parse(r.headers.get("idempotency-expires") ?? "");
    expect(expires - Date.now()).toBeGreaterThan(23.9 * 3_600_000);
    expect(expires - Date.now()).toBeLessThan(24.1 * 3_600_000);
  });
});
