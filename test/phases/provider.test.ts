/** The payment-provider simulator, over real HTTP, and the client that classifies its answers. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Provider, startProvider } from "../../src/testing/provider.ts";
import { chargeProvider, listCharges } from "../../src/testing/provider-client.ts";

const charge = (p: Provider, idempotencyKey: string, extra: Record<string, unknown> = {}) =>
  chargeProvider(p.url, { amount: 5000, currency: "eur", idempotencyKey, timeoutMs: 500, ...extra });

describe("provider simulator", () => {
  let p: Provider;
  beforeAll(async () => {
    p = await startProvider({ seed: 3, declineAmounts: [6666], declineCards: ["4000000000000002"] });
  });
  afterAll(async () => {
    await p?.close();
  });

  it("returns the existing charge for a repeated Idempotency-Key", async () => {
    const a = await charge(p, "k-repeat");
    const b = await charge(p, "k-repeat");
    expect(a.kind).toBe("charged");
    expect(b).toMatchObject({ kind: "charged", replayed: true });
    if (a.kind === "charged" && b.kind === "charged") expect(b.charge.id).toBe(a.charge.id);
    const listed = (await listCharges(p.url)).filter((c) => c.idempotency_key === "k-repeat");
    expect(listed).toHaveLength(1);
    expect(listed[0]).toMatchObject({ amount: 5000, currency: "eur", status: "succeeded" });
    const one = await fetch(`${p.url}/v1/charges/${listed[0]!.id}`);
    expect(((await one.json()) as { id: string }).id).toBe(listed[0]!.id);
    expect((await fetch(`${p.url}/v1/charges/ch_nope`)).status).toBe(404);
  });

  it("declines chosen amounts and cards with a final 402, remembered under the key", async () => {
    expect((await charge(p, "k-decline-amount", { amount: 6666 })).kind).toBe("declined");
    expect((await charge(p, "k-decline-card", { card: "4000000000000002" })).kind).toBe("declined");
    expect(await charge(p, "k-decline-card", { card: "4000000000000002" })).toMatchObject({
      kind: "declined",
      code: "card_declined",
    });
    const mine = p.charges().filter((c) => c.idempotency_key?.startsWith("k-decline"));
    expect(mine.map((c) => c.status)).toEqual(["failed", "failed"]);
  });

  it("answers a body over 64 KiB with 413 and charges nothing", async () => {
    const before = p.charges().length;
    const res = await fetch(`${p.url}/v1/charges`, {
      method: "POST",
      headers: { "content-type": "application/json", "idempotency-key": "k-huge" },
      body: JSON.stringify({ amount: 5000, currency: "eur", reference: "x".repeat(70_000) }),
    });
    expect(res.status).toBe(413);
    expect(await res.json()).toMatchObject({ error: { code: "body_too_large" } });
    expect(p.charges()).toHaveLength(before);
    expect((await charge(p, "k-after-huge")).kind).toBe("charged"); // the server still answers
  });

  it("refuses a key reused with other parameters (final, not retryable)", async () => {
    await charge(p, "k-reuse");
    expect(await charge(p, "k-reuse", { amount: 1 })).toMatchObject({ kind: "rejected", status: 422 });
  });

  it("injects faults per request: 500 and timeout charge nothing, drop charges and loses the reply", async () => {
    expect(await charge(p, "k-500", { fault: "500" })).toMatchObject({ kind: "transient", status: 500 });
    expect(await charge(p, "k-timeout", { fault: "timeout", timeoutMs: 100 })).toMatchObject({
      kind: "transient",
      reason: "timeout",
    });
    expect(await charge(p, "k-drop", { fault: "drop" })).toMatchObject({
      kind: "transient",
      reason: "network",
    });
    expect((await charge(p, "k-decline-hdr", { fault: "decline" })).kind).toBe("declined");
    const keys = p.charges().map((c) => c.idempotency_key);
    expect(keys).not.toContain("k-500");
    expect(keys).not.toContain("k-timeout");
    expect(keys).toContain("k-drop");
    // The retry of the dropped reply finds the charge that was made.
    expect(await charge(p, "k-drop")).toMatchObject({ kind: "charged", replayed: true });
  });

  it("scripts faults for the next requests, also over HTTP", async () => {
    p.failNext("503");
    expect(await charge(p, "k-next")).toMatchObject({ kind: "transient", status: 503 });
    await fetch(`${p.url}/_sim/faults`, { method: "POST", body: JSON.stringify({ next: ["500"] }) });
    expect(await charge(p, "k-next")).toMatchObject({ kind: "transient", status: 500 });
    expect((await charge(p, "k-next")).kind).toBe("charged");
  });

  it("adds latency, and honours an abort signal", async () => {
    const slow = await startProvider({ latencyMs: 120 });
    try {
      const t0 = performance.now();
      expect((await charge(slow, "k-slow")).kind).toBe("charged");
      expect(performance.now() - t0).toBeGreaterThanOrEqual(110);
      const ctl = new AbortController();
      const pending = charge(slow, "k-abort", { signal: ctl.signal });
      ctl.abort();
      expect(await pending).toMatchObject({ kind: "transient", reason: "aborted" });
    } finally {
      await slow.close();
    }
  });

  it("is deterministic when seeded: same faults, same charge ids", async () => {
    const run = async () => {
      const sim = await startProvider({ seed: 99, faults: { error: 0.3, drop: 0.2, decline: 0.1 } });
      try {
        const kinds: string[] = [];
        for (let i = 0; i < 30; i++) kinds.push((await charge(sim, `k-${i}`)).kind);
        return { kinds, ids: sim.charges().map((c) => c.id) };
      } finally {
        await sim.close();
      }
    };
    const a = await run();
    const b = await run();
    expect(a).toEqual(b);
    expect(new Set(a.kinds)).toEqual(new Set(["charged", "transient", "declined"]));
  });

  it("forgets a key and its charge after the retention, like a real provider: a later repeat charges again", async () => {
    let now = Date.parse("2026-12-01T00:00:00Z");
    const sim = await startProvider({ seed: 5, retentionMs: 3_600_000, clock: () => now });
    try {
      const first = await charge(sim, "k-old");
      now += 59 * 60_000; // 59 minutes later: still the same charge
      const again = await charge(sim, "k-old");
      expect(again).toMatchObject({ kind: "charged", replayed: true });
      now += 2 * 60_000; // 61 minutes after the first: forgotten
      const later = await charge(sim, "k-old");
      expect(later).toMatchObject({ kind: "charged" });
      expect("replayed" in later && later.replayed).toBeFalsy();
      if (first.kind === "charged" && later.kind === "charged")
        expect(later.charge.id).not.toBe(first.charge.id);
      // Only the charge within the retention is listed, found, and held.
      expect(sim.charges().map((c) => c.seq)).toEqual([2]);
      expect(await listCharges(sim.url)).toHaveLength(1);
      if (first.kind === "charged")
        expect((await fetch(`${sim.url}/v1/charges/${first.charge.id}`)).status).toBe(404);
    } finally {
      await sim.close();
    }
    await expect(startProvider({ retentionMs: 0 })).rejects.toThrow("retentionMs must be a positive number");
  });

  it("holds only the retention's charges however many it made", async () => {
    let now = 0;
    const sim = await startProvider({ seed: 6, retentionMs: 1_000, clock: () => now });
    try {
      for (let i = 0; i < 3_000; i++) {
        now += 10; // 100 charges a second, each kept one second
        await charge(sim, `k-${i}`);
      }
      const held = sim.charges();
      expect(held.length).toBeGreaterThanOrEqual(99);
      expect(held.length).toBeLessThanOrEqual(100);
      expect(held.at(-1)!.seq).toBe(3_000);
    } finally {
      await sim.close();
    }
  });
});
