/**
 * First claims of a new key, under concurrency: mid-partition (one statement: lookup-or-claim) and in
 * the first minutes of a partition (claim plus boundary marker, in one transaction). Exactly one
 * request takes the lease; the others are told the key is in flight.
 */
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { isKeyInFlightError } from "../../src/core/index.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { sayWhySkippedWithoutServer, serverBackends } from "../helpers/db.ts";
import { TestTime } from "../helpers/time.ts";
import { claimOf, deferred, openWorld, paymentsRunner, type World } from "./helpers.ts";

sayWhySkippedWithoutServer();

const PAY = { amount_cents: 1500, currency: "eur" };
const DAY = 86_400_000;

describe.each(serverBackends)("first claims on $name", (backend) => {
  let w: World;
  beforeAll(async () => {
    w = await openWorld(backend);
  });
  afterAll(async () => {
    await w?.close();
  });

  async function storm(at: number, key: string) {
    const store = await PostgresStore.open(w.db, { timeShift: new TestTime(at) });
    const hold = deferred();
    const runner = paymentsRunner(store, w.provider.url, { beforeCharge: () => hold.promise });
    const c = claimOf("acct", key, PAY);
    const outs = Array.from({ length: 20 }, () => runner.run(c, PAY).catch((e) => e));
    // Let every duplicate hit the database while the winner is held in its external phase.
    await new Promise((r) => setTimeout(r, 300));
    hold.resolve();
    const results = await Promise.all(outs);
    const executed = results.filter((r) => r?.kind === "executed");
    expect(executed).toHaveLength(1);
    // The others: 409 while the winner works, or (stragglers on a busy machine) its replay.
    expect(
      results.every((r) => r?.kind === "executed" || r?.kind === "replayed" || isKeyInFlightError(r)),
    ).toBe(true);
    expect(results.filter((r) => isKeyInFlightError(r)).length).toBeGreaterThan(0);
    expect((await runner.run(c, PAY)).kind).toBe("replayed");
    const { rows } = await w.db.query<{ marker: boolean; bucket: number }>(
      "SELECT marker, bucket FROM idem.keys WHERE scope = 'acct' AND key = $1 ORDER BY marker",
      [key],
    );
    return { rows, bucket: store.partitions.bucketOf(at) };
  }

  it("mid-partition: one statement claims, the duplicates get 409, one charge", async () => {
    const { rows } = await storm(Date.UTC(2034, 1, 1, 12), "claim-mid");
    expect(rows.map((r) => r.marker)).toEqual([false]);
    expect(await w.counts("claim-mid")).toMatchObject({ charges: 1, receipts: 1 });
  });

  it("just after a partition boundary: the claim also marks the previous partition", async () => {
    const { rows, bucket } = await storm(Date.UTC(2034, 1, 2) + 1, "claim-boundary");
    expect(rows.map((r) => [r.marker, Number(r.bucket)])).toEqual([
      [false, bucket],
      [true, bucket - 1],
    ]);
    expect(await w.counts("claim-boundary")).toMatchObject({ charges: 1, receipts: 1 });
  });

  it("claims by the database's clock when this process's clock jumps after the store measured it", async () => {
    // The claim names the partitions it reads from this process's estimate of the database's time. A
    // clock stepped back three days (an NTP step, a VM resumed) names the wrong ones: the statement
    // says so and claims nothing, and the claim goes by the database's clock. Without that check the
    // key saved yesterday (in the partition before the current one) would be claimed again: a second
    // charge.
    const now = new TestTime(Date.UTC(2034, 1, 5, 23));
    const store = await PostgresStore.open(w.db, { timeShift: now, retentionMs: 2 * DAY });
    const runner = paymentsRunner(store, w.provider.url);
    const c = claimOf("acct", "claim-clock-jump", PAY);
    const first = await runner.run(c, PAY);
    expect(first.kind).toBe("executed");
    now.ms = Date.UTC(2034, 1, 6, 1); // the next partition, past its boundary overlap
    vi.useFakeTimers({ toFake: ["Date"] });
    try {
      vi.setSystemTime(Date.now() - 3 * DAY);
      const again = await runner.run(c, PAY);
      expect(again.kind).toBe("replayed");
      expect(Buffer.from(again.response.body)).toEqual(Buffer.from(first.response.body));
      const k = claimOf("acct", "claim-clock-jump-new", PAY);
      expect((await runner.run(k, PAY)).kind).toBe("executed");
      expect((await runner.run(k, PAY)).kind).toBe("replayed");
    } finally {
      vi.useRealTimers();
    }
    expect(await w.counts("claim-clock-jump")).toMatchObject({ charges: 1, receipts: 1 });
    expect(await w.counts("claim-clock-jump-new")).toMatchObject({ charges: 1, receipts: 1 });
  });
});
