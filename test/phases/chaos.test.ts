/**
 * 200 concurrent clients retrying 20 payments, with crashes at random crash points and a provider that
 * times out, fails and drops replies at random (all seeded). Whatever happens, each payment is charged
 * once and has one receipt.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isKeyInFlightError, isLeaseLostError, isRetryableError } from "../../src/core/index.ts";
import { complete } from "../../src/postgres/admin/complete.ts";
import { SimulatedCrashError } from "../../src/postgres/phases/index.ts";
import { randomCrashes } from "../../src/testing/faults.ts";
import { createRng } from "../../src/testing/prng.ts";
import { sayWhySkippedWithoutServer, serverBackends } from "../helpers/db.ts";
import { claimOf, LEASE_MS, openWorld, sleep, text, type World } from "./helpers.ts";

sayWhySkippedWithoutServer();

const KEYS = 20;
const CLIENTS_PER_KEY = 10;
const SEED = 20_240_611;

describe.each(serverBackends)("exactly once under chaos on $name", (backend) => {
  let w: World;
  beforeAll(async () => {
    w = await openWorld(backend, { seed: SEED, faults: { timeout: 0.05, error: 0.08, drop: 0.08 } });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("200 concurrent retries of 20 keys with random crashes: exactly 20 charges and 20 receipts", async () => {
    const faults = randomCrashes({ seed: SEED, rate: 0.12 });
    const chaotic = w.runner({ faults, timeoutMs: 1_000, name: "payments" });
    const rng = createRng(SEED);
    const outcome = { executed: 0, replayed: 0, inFlight: 0, retryable: 0, lost: 0, crashed: 0 };
    const bodies = new Map<string, Set<string>>();

    // Each client tries up to 6 times. After a crash, time jumps past the lease (as 30 s would), which
    // also expires the leases of workers still running: they get taken over mid-phase.
    const client = async (i: number) => {
      const n = i % KEYS;
      const key = `chaos-${n}`;
      const input = { amount_cents: 1000 + n, currency: "eur" };
      const c = claimOf("acct-chaos", key, input);
      await sleep(rng.int(20));
      for (let attempt = 0; attempt < 6; attempt++) {
        try {
          const out = await chaotic.run(c, input);
          outcome[out.kind]++;
          if (out.response.status === 201) {
            if (!bodies.has(key)) bodies.set(key, new Set());
            bodies.get(key)!.add(text(out.response));
          }
          return;
        } catch (err) {
          if (err instanceof SimulatedCrashError) {
            outcome.crashed++;
            w.now.ms += LEASE_MS + 1;
          } else if (isKeyInFlightError(err)) outcome.inFlight++;
          else if (isRetryableError(err)) outcome.retryable++;
          else if (isLeaseLostError(err)) outcome.lost++;
          else throw err;
          await sleep(10 + rng.int(40));
        }
      }
    };
    await Promise.all(Array.from({ length: KEYS * CLIENTS_PER_KEY }, (_, i) => client(i)));
    expect(faults.fired).toBeGreaterThan(0);

    // Keys whose every retry crashed or failed: the completer finishes them (with a healthy provider).
    w.provider.setFaults({});
    const healthy = w.runner({ name: "payments" });
    for (let round = 0; round < 5; round++) {
      w.now.ms += LEASE_MS + 1;
      const report = await complete({ store: w.store, runners: [healthy], olderThanMs: 0 });
      if (report.found === 0) break;
    }

    const states = await Promise.all(
      Array.from(
        { length: KEYS },
        async (_, n) => (await w.store.inspect("acct-chaos", `chaos-${n}`))?.state,
      ),
    );
    expect(states).toEqual(Array(KEYS).fill("done"));
    const charges = w.provider.charges().filter((ch) => ch.status === "succeeded");
    expect(charges).toHaveLength(KEYS);
    expect(new Set(charges.map((ch) => ch.idempotency_key)).size).toBe(KEYS);
    expect(await w.counts()).toMatchObject({ charges: KEYS, receipts: KEYS, payments: KEYS });
    // Every 201 a client saw for a key is the same answer.
    for (const set of bodies.values()) expect(set.size).toBe(1);
    // The chaos really happened.
    expect(outcome.crashed).toBeGreaterThan(0);
    expect(outcome.executed + outcome.replayed).toBeGreaterThan(0);
  });
});
