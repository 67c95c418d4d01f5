/**
 * Long phases: the heartbeat keeps a working worker's lease alive, and a worker whose renewal finds the
 * lease taken over records nothing.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isKeyInFlightError, isLeaseLostError } from "../../src/core/index.ts";
import { claimOf, deferred, LEASE_MS, openWorld, serverOrEmbedded, sleep, type World } from "./helpers.ts";

const PAY = { amount_cents: 700, currency: "eur" };

describe.each(serverOrEmbedded)("leases on $name", (backend) => {
  let w: World;
  beforeAll(async () => {
    w = await openWorld(backend);
  });
  afterAll(async () => {
    await w?.close();
  });

  it("renews the lease during a long external phase, so a duplicate is told to wait instead of taking over", async () => {
    const key = "heartbeat-renews";
    const c = claimOf("acct", key, PAY);
    const halfway = deferred();
    const go = deferred();
    const first = w
      .runner({
        heartbeatMs: 10,
        beforeCharge: async () => {
          // 50 s pass inside the phase, well past the 30 s lease, with beats in between.
          for (let i = 0; i < 5; i++) {
            w.now.ms += 10_000;
            await sleep(40);
          }
          halfway.resolve();
          await go.promise;
        },
      })
      .run(c, PAY);
    await halfway.promise;
    const dup = await w
      .runner()
      .run(c, PAY)
      .catch((e) => e);
    expect(isKeyInFlightError(dup)).toBe(true);
    go.resolve();
    expect((await first).response.status).toBe(201);
    expect(await w.counts(key)).toMatchObject({ charges: 1, receipts: 1 });
  });

  it("without a heartbeat the same long phase is taken over (the slow worker is then refused)", async () => {
    const key = "no-heartbeat";
    const c = claimOf("acct", key, PAY);
    const halfway = deferred();
    const go = deferred();
    const first = w
      .runner({
        heartbeatMs: 0,
        beforeCharge: async () => {
          w.now.ms += LEASE_MS + 1;
          halfway.resolve();
          await go.promise;
        },
      })
      .run(c, PAY)
      .catch((e) => e);
    await halfway.promise;
    expect((await w.runner().run(c, PAY)).response.status).toBe(201);
    go.resolve();
    expect(isLeaseLostError(await first)).toBe(true);
    expect(await w.counts(key)).toMatchObject({ charges: 1, receipts: 1 });
  });

  it("stops without recording anything when a renewal finds another worker's token", async () => {
    const key = "heartbeat-lost";
    const c = claimOf("acct", key, PAY);
    let aborted = false;
    const first = w
      .runner({
        heartbeatMs: 10,
        beforeCharge: async (ctx) => {
          // Another worker takes over behind our back (as after a long network partition).
          await w.db.query(
            "UPDATE idem.keys SET lease_token = gen_random_uuid() WHERE scope = 'acct' AND key = $1 AND NOT marker",
            [key],
          );
          await new Promise<void>((resolve) => {
            ctx.signal.addEventListener("abort", () => resolve(), { once: true });
            setTimeout(resolve, 2_000);
          });
          aborted = ctx.signal.aborted;
        },
      })
      .run(c, PAY)
      .catch((e) => e);
    expect(isLeaseLostError(await first)).toBe(true);
    expect(aborted).toBe(true);
    expect(await w.point("acct", key)).toBe("started");
    expect(await w.counts(key)).toMatchObject({ receipts: 0, payments: 0 });
  });
});
