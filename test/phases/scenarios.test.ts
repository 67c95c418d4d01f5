/**
 * The spec's scenario table for recovery points, each with its counts: provider charges (from the
 * simulator, over real HTTP), receipt rows in the outbox, and the key's final recovery point.
 * Lease expiry is driven by the store's clock, never by sleeping.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  isKeyInFlightError,
  isKeyMismatchError,
  isLeaseLostError,
  isRetryableError,
} from "../../src/core/index.ts";
import { MAX_IN_FLIGHT_RETRY_AFTER_S, SimulatedCrashError } from "../../src/postgres/phases/index.ts";
import { crashAt, pauseAt } from "../../src/testing/faults.ts";
import { listCharges } from "../../src/testing/provider-client.ts";
import { backends } from "../helpers/db.ts";
import { claimOf, deferred, LEASE_MS, openWorld, sleep, text, type World } from "./helpers.ts";

const PAY = { amount_cents: 5000, currency: "eur" };
const DECLINED = { amount_cents: 6666, currency: "eur" };
const ACCT = "42";

describe.each(backends)("recovery points on $name", (backend) => {
  let w: World;
  beforeAll(async () => {
    w = await openWorld(backend, { declineAmounts: [DECLINED.amount_cents] });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("no crash: one charge, one receipt, and later tries replay", async () => {
    const run = w.runner();
    const c = claimOf(ACCT, "no-crash", PAY);
    const tries = [await run.run(c, PAY), await run.run(c, PAY), await run.run(c, PAY)];
    expect(tries.map((t) => [t.kind, t.response.status])).toEqual([
      ["executed", 201],
      ["replayed", 201],
      ["replayed", 201],
    ]);
    expect(new Set(tries.map((t) => text(t.response))).size).toBe(1);
    expect(await w.counts("no-crash")).toMatchObject({ charges: 1, receipts: 1, payments: 1 });
    expect(await w.point(ACCT, "no-crash")).toBe("done");
    // The provider got OUR key, naming this claim of the key: <scope>:<claim id>.
    const claimId = (await w.store.inspect(ACCT, "no-crash"))!.claimId;
    expect(claimId).toMatch(/^[0-9a-f-]{36}$/);
    expect((await listCharges(w.provider.url)).map((ch) => ch.idempotency_key)).toContain(`42:${claimId}`);
  });

  it("replays a done key without taking a lease", async () => {
    const run = w.runner();
    const c = claimOf(ACCT, "replay-no-lease", PAY);
    await run.run(c, PAY);
    const before = await w.lease(ACCT, "replay-no-lease");
    w.now.ms += 1000;
    expect((await run.run(c, PAY)).kind).toBe("replayed");
    const after = await w.lease(ACCT, "replay-no-lease");
    expect(after.lease_token).toBeNull();
    expect(after.updated_at).toEqual(before.updated_at);
  });

  it("crash after the provider charged: the retry resumes and the provider's dedup keeps one charge", async () => {
    const key = "crash-after-charge";
    const c = claimOf(ACCT, key, PAY);
    const crashing = w.runner({ faults: crashAt("after-external", { phase: "started" }) });
    await expect(crashing.run(c, PAY)).rejects.toBeInstanceOf(SimulatedCrashError);
    expect(await w.counts(key)).toMatchObject({ charges: 1, receipts: 0 });
    // The crashed worker's lease is still live: an immediate retry is told to come back later.
    const inFlight = await w
      .runner()
      .run(c, PAY)
      .catch((e) => e);
    expect(isKeyInFlightError(inFlight)).toBe(true);
    expect(inFlight.retryAfterSeconds).toBe(Math.min(LEASE_MS / 1000, MAX_IN_FLIGHT_RETRY_AFTER_S));
    w.now.ms += LEASE_MS + 1; // as 30 real seconds would
    const takeovers: string[] = [];
    const retry = await w.runner({ onLeaseTakeover: (e) => takeovers.push(e.point) }).run(c, PAY);
    expect([retry.kind, retry.response.status]).toEqual(["executed", 201]);
    // It took the dead worker's key over at its last recovery point: the charge was never recorded, so
    // the external phase runs again and the provider's dedup answers with the first charge.
    expect(takeovers).toEqual(["started"]);
    expect((await w.runner().run(c, PAY)).kind).toBe("replayed");
    expect(await w.counts(key)).toMatchObject({ charges: 1, receipts: 1, payments: 1 });
    expect(await w.point(ACCT, key)).toBe("done");
  });

  it("crash before the final commit: nothing of the local phase stays, the retry finishes it once", async () => {
    const key = "crash-before-commit";
    const c = claimOf(ACCT, key, PAY);
    const crashing = w.runner({ faults: crashAt("before-commit", { phase: "charged" }) });
    await expect(crashing.run(c, PAY)).rejects.toBeInstanceOf(SimulatedCrashError);
    expect(await w.point(ACCT, key)).toBe("charged");
    expect(await w.counts(key)).toMatchObject({ charges: 1, receipts: 0, payments: 0 });
    w.now.ms += LEASE_MS + 1;
    const retry = await w.runner().run(c, PAY);
    expect([retry.kind, retry.response.status]).toEqual(["executed", 201]);
    expect((await w.runner().run(c, PAY)).kind).toBe("replayed");
    expect(await w.counts(key)).toMatchObject({ charges: 1, receipts: 1, payments: 1 });
    expect(await w.point(ACCT, key)).toBe("done");
  });

  it("a slow worker whose lease expires mid-charge: the takeover wins, the late worker records nothing", async () => {
    const key = "slow-mid-charge";
    const c = claimOf(ACCT, key, PAY);
    const arrived = deferred();
    const wake = deferred();
    // P1 stalls inside its external phase, right before the provider call (heartbeat off: a frozen process).
    const p1 = w
      .runner({
        beforeCharge: async () => {
          arrived.resolve();
          await wake.promise;
        },
      })
      .run(c, PAY)
      .catch((e) => e);
    await arrived.promise;
    w.now.ms += LEASE_MS + 1;
    const p2 = await w.runner().run(c, PAY);
    expect([p2.kind, p2.response.status]).toEqual(["executed", 201]);
    wake.resolve();
    const late = await p1;
    expect(isLeaseLostError(late)).toBe(true);
    expect(await w.counts(key)).toMatchObject({ charges: 1, receipts: 1, payments: 1 });
    expect(await w.point(ACCT, key)).toBe("done");
  });

  it("a slow worker cannot commit its local phase's business rows after a takeover", async () => {
    const key = "slow-before-local";
    const c = claimOf(ACCT, key, PAY);
    // P1 charges and records "charged", then stalls before its local transaction.
    const stall = pauseAt("before-phase", { phase: "charged", key });
    const p1 = w
      .runner({ faults: stall })
      .run(c, PAY)
      .catch((e) => e);
    await stall.reached;
    expect(await w.point(ACCT, key)).toBe("charged");
    w.now.ms += LEASE_MS + 1;
    expect((await w.runner().run(c, PAY)).response.status).toBe(201);
    stall.release();
    expect(isLeaseLostError(await p1)).toBe(true);
    // The fence reached the business writes: one payment row and one receipt, not two.
    expect(await w.counts(key)).toMatchObject({ charges: 1, receipts: 1, payments: 1 });
  });

  it("wrong body on a key nobody holds gets 422 without a lease; the real retry then runs at once", async () => {
    const key = "wrong-body";
    const c = claimOf(ACCT, key, PAY);
    w.provider.failNext("timeout");
    const first = await w
      .runner({ timeoutMs: 150 })
      .run(c, PAY)
      .catch((e) => e);
    expect(isRetryableError(first)).toBe(true);
    expect((await w.lease(ACCT, key)).lease_token).toBeNull(); // a timeout frees the lease at once
    const wrong = { amount_cents: 9999, currency: "eur" };
    const mismatch = await w
      .runner()
      .run(claimOf(ACCT, key, wrong), wrong)
      .catch((e) => e);
    expect(isKeyMismatchError(mismatch)).toBe(true);
    expect((await w.lease(ACCT, key)).lease_token).toBeNull(); // the wrong body took no lease
    const retry = await w.runner().run(c, PAY); // no clock advance needed
    expect([retry.kind, retry.response.status]).toEqual(["executed", 201]);
    expect(await w.counts(key)).toMatchObject({ charges: 1, receipts: 1, payments: 1 });
    expect(await w.point(ACCT, key)).toBe("done");
  });

  it("card declined twice: the decline is saved as done and replayed, nothing charged, no receipt", async () => {
    const key = "declined";
    const c = claimOf(ACCT, key, DECLINED);
    const first = await w.runner().run(c, DECLINED);
    const second = await w.runner().run(c, DECLINED);
    expect([first.kind, first.response.status]).toEqual(["executed", 402]);
    expect([second.kind, second.response.status]).toEqual(["replayed", 402]);
    expect(text(second.response)).toBe(text(first.response));
    expect(await w.counts(key)).toMatchObject({ charges: 0, declined: 1, receipts: 0, payments: 0 });
    expect(await w.point(ACCT, key)).toBe("done");
  });

  it("client hangs up during a provider timeout: the lease is still freed, so an immediate retry runs", async () => {
    const key = "hang-up";
    const c = claimOf(ACCT, key, PAY);
    w.provider.failNext("timeout");
    const client = new AbortController();
    const first = w
      .runner({ timeoutMs: 200 })
      .run(c, PAY, { signal: client.signal })
      .catch((e) => e);
    await sleep(50);
    client.abort(); // the client is gone while the provider call hangs
    expect(isRetryableError(await first)).toBe(true);
    const retry = await w.runner().run(c, PAY); // right away: no 409, no 30 s wait
    expect([retry.kind, retry.response.status]).toEqual(["executed", 201]);
    expect(await w.counts(key)).toMatchObject({ charges: 1, receipts: 1, payments: 1 });
    expect(await w.point(ACCT, key)).toBe("done");
  });

  it("a client that hung up before anything was claimed claims nothing", async () => {
    const ctl = new AbortController();
    ctl.abort();
    const err = await w
      .runner()
      .run(claimOf(ACCT, "gone-early", PAY), PAY, { signal: ctl.signal })
      .catch((e) => e);
    expect(isRetryableError(err)).toBe(true);
    expect(await w.point(ACCT, "gone-early")).toBeUndefined();
  });

  it("concurrent duplicate: 409 with Retry-After while the first holds a live lease", async () => {
    const key = "concurrent";
    const c = claimOf(ACCT, key, PAY);
    const arrived = deferred();
    const go = deferred();
    const first = w
      .runner({
        beforeCharge: async () => {
          arrived.resolve();
          await go.promise;
        },
      })
      .run(c, PAY);
    await arrived.promise;
    w.now.ms += 10_000;
    const dup = await w
      .runner()
      .run(c, PAY)
      .catch((e) => e);
    expect(isKeyInFlightError(dup)).toBe(true);
    expect(dup.status).toBe(409);
    expect(dup.retryAfterSeconds).toBe(MAX_IN_FLIGHT_RETRY_AFTER_S);
    go.resolve();
    expect((await first).response.status).toBe(201);
    expect((await w.runner().run(c, PAY)).kind).toBe("replayed");
    expect(await w.counts(key)).toMatchObject({ charges: 1, receipts: 1, payments: 1 });
  });
});
