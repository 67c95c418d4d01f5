/**
 * Phases mode's spans and counters with the real SDK, on the payments runner of test/phases (a real
 * provider simulator without idempotency keys): each phase, the lease takeover after a crash and the
 * provider lookup it makes instead of calling again, a fencing refusal, a key sent to review, a run of
 * the completer, and a sweep with the partitions it dropped.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { complete } from "../../src/postgres/admin/complete.ts";
import { SimulatedCrashError } from "../../src/postgres/phases/index.ts";
import { crashAt } from "../../src/testing/faults.ts";
import { claimOf, LEASE_MS, openWorld, serverOrEmbedded, type World } from "../phases/helpers.ts";
import { installSdk, type Sdk } from "./sdk.ts";

const PAY = { amount_cents: 2_000, currency: "eur" };
const backend = serverOrEmbedded[0]!;

describe(`phases spans on ${backend.name}`, () => {
  let w: World;
  let sdk: Sdk;
  beforeAll(async () => {
    sdk = installSdk();
    w = await openWorld(backend, { idempotency: false });
  });
  afterAll(async () => {
    await w?.close();
    await sdk?.uninstall();
  });

  const attr = (name: string, key: string) => sdk.named(name).map((s) => s.attributes[key]);

  it("a crash after the call, then a takeover that looks the charge up instead of calling again", async () => {
    sdk.exporter.reset();
    const c = claimOf("acct", "otel-crashed", PAY);
    await expect(
      w.runner({ noIdempotency: "search", faults: crashAt("after-external") }).run(c, PAY),
    ).rejects.toBeInstanceOf(SimulatedCrashError);
    w.now.ms += LEASE_MS + 1;
    expect((await w.runner({ noIdempotency: "search" }).run(c, PAY)).response.status).toBe(201);
    await sdk.flush();
    const claims = sdk.named("idem.phases.claim");
    expect(claims.map((s) => s.attributes["idem.claim.outcome"])).toEqual(["claimed", "claimed"]);
    expect(claims[1]!.events.map((e) => e.name)).toEqual(["idem.lease_takeover"]);
    expect(attr("idem.phase.lookup", "idem.lookup.found")).toEqual([true]);
    const phases = sdk
      .named("idem.phase")
      .map((s) => `${s.attributes["idem.phase.name"]}/${s.attributes["idem.phase.kind"]}`);
    expect(phases[0]).toBe("started/external"); // the crashed worker's call
    expect(phases.length).toBeGreaterThanOrEqual(3);
    expect((await sdk.points("idem.phases.takeovers"))[0]?.value).toBe(1);
  });

  it("a stale worker stopped by the fence: its phase span says fenced", async () => {
    sdk.exporter.reset();
    const c = claimOf("acct", "otel-fenced", PAY);
    // The first worker stalls in its call past the lease; a second takes over and finishes.
    w.provider.failNext("late");
    const stale = w.runner({ noIdempotency: "search", timeoutMs: 2_000, heartbeatMs: 60_000 }).run(c, PAY);
    await new Promise((r) => setTimeout(r, 100));
    w.now.ms += LEASE_MS + 1;
    const fresh = await w.runner({ noIdempotency: "search" }).run(c, PAY);
    expect(fresh.response.status).toBe(201);
    await stale.catch(() => {});
    await sdk.flush();
    expect(attr("idem.phase", "idem.phase.fenced")).toContain(true);
  });

  it("a key sent to review, the completer's run, and a sweep", async () => {
    sdk.exporter.reset();
    const c = claimOf("acct", "otel-review", PAY);
    const runner = w.runner({ noIdempotency: "search", timeoutMs: 300, maxLookupFailures: 1 });
    w.provider.setSearch(false);
    w.provider.failNext("late");
    for (let i = 0; i < 2; i++) await runner.run(c, PAY).catch(() => {});
    w.provider.setSearch(true);
    await complete({ store: w.store, runners: [runner], olderThanMs: 0 });
    w.now.ms += 40 * 86_400_000;
    const { dropped } = await w.store.sweep();
    await sdk.flush();
    const review = sdk
      .spans()
      .flatMap((s) => s.events)
      .filter((e) => e.name === "idem.needs_review");
    expect(review).toHaveLength(1);
    expect(String(review[0]!.attributes?.["idem.review.reason"])).toMatch(/lookups could not tell/);
    expect((await sdk.points("idem.phases.needs_review"))[0]?.value).toBe(1);
    expect(sdk.named("idem.complete")).toHaveLength(1);
    expect(typeof sdk.named("idem.complete")[0]!.attributes["idem.complete.found"]).toBe("number");
    expect(attr("idem.sweep", "idem.sweep.partitions_dropped")).toEqual([dropped.length]);
    expect(dropped.length).toBeGreaterThan(0);
  });
});
