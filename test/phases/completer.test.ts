/**
 * The completer finishes keys abandoned mid-way, from the stored input; the reaper (the store's sweep)
 * drops keys past retention.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { complete } from "../../src/postgres/admin/complete.ts";
import { SimulatedCrashError } from "../../src/postgres/phases/index.ts";
import { crashAt } from "../../src/testing/faults.ts";
import { claimOf, LEASE_MS, openWorld, serverOrEmbedded, type World } from "./helpers.ts";

const DAY = 86_400_000;

describe.each(serverOrEmbedded)("completer and reaper on $name", (backend) => {
  let w: World;
  beforeAll(async () => {
    w = await openWorld(backend, {}, { retentionMs: DAY });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("finishes a payment whose client never retried, using the stored request", async () => {
    const key = "abandoned";
    const input = { amount_cents: 4200, currency: "usd" };
    const crashing = w.runner({ faults: crashAt("after-external") });
    await expect(crashing.run(claimOf("acct", key, input), input)).rejects.toBeInstanceOf(
      SimulatedCrashError,
    );
    const runner = w.runner();

    // Too recent, and its lease is still live: left alone.
    const early = await complete({ store: w.store, runners: [runner], olderThanMs: 60_000 });
    expect(early.results.find((r) => r.key === key)).toBeUndefined();

    w.now.ms += 61_000;
    const report = await complete({ store: w.store, runners: [runner], olderThanMs: 60_000 });
    expect(report.results.find((r) => r.key === key)).toMatchObject({
      result: "completed",
      status: 201,
      point: "started",
    });
    expect(await w.point("acct", key)).toBe("done");
    expect(await w.counts(key)).toMatchObject({ charges: 1, receipts: 1, payments: 1 });
    const { rows } = await w.db.query<{ amount_cents: number }>(
      "SELECT amount_cents FROM payments WHERE key = $1",
      [key],
    );
    expect(rows).toEqual([{ amount_cents: 4200 }]);
    // A client retrying later gets the completer's answer.
    expect((await runner.run(claimOf("acct", key, input), input)).kind).toBe("replayed");
  });

  it("lists without running on a dry run, and skips keys whose runner it was not given", async () => {
    const input = { amount_cents: 100, currency: "eur" };
    const crashing = w.runner({ faults: crashAt("after-claim"), name: "other-runner" });
    await expect(crashing.run(claimOf("acct", "orphan", input), input)).rejects.toBeInstanceOf(
      SimulatedCrashError,
    );
    w.now.ms += LEASE_MS + 61_000;
    const dry = await complete({
      store: w.store,
      runners: [w.runner({ name: "other-runner" })],
      dryRun: true,
    });
    expect(dry.results.find((r) => r.key === "orphan")?.result).toBe("pending");
    const report = await complete({ store: w.store, runners: [w.runner()] });
    expect(report.results.find((r) => r.key === "orphan")?.result).toBe("no-runner");
    expect(await w.point("acct", "orphan")).toBe("started");
    expect(await w.counts("orphan")).toMatchObject({ charges: 0, payments: 0 });
  });

  it("the reaper drops keys past retention, finished or not, a partition at a time", async () => {
    const input = { amount_cents: 300, currency: "eur" };
    const crashing = w.runner({ faults: crashAt("after-claim") });
    await expect(crashing.run(claimOf("acct", "reaped", input), input)).rejects.toBeInstanceOf(
      SimulatedCrashError,
    );
    const bucket = w.store.partitions.bucketOf(w.now.ms);
    w.now.ms += 3 * DAY;
    const { dropped } = await w.store.sweep();
    expect(dropped).toContain(bucket);
    expect(await w.point("acct", "reaped")).toBeUndefined();
    // Nothing left for the completer either.
    const report = await complete({ store: w.store, runners: [w.runner()], olderThanMs: 0 });
    expect(report.found).toBe(0);
  });
});
