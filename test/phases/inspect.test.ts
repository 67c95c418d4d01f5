/** `store.inspect(scope, key)`: what an operator sees of one key, through the store's API. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SimulatedCrashError } from "../../src/postgres/phases/index.ts";
import { crashAt } from "../../src/testing/faults.ts";
import { claimOf, openWorld, serverOrEmbedded, text, type World } from "./helpers.ts";

const DAY = 86_400_000;

describe.each(serverOrEmbedded)("inspect on $name", (backend) => {
  let w: World;
  beforeAll(async () => {
    w = await openWorld(backend, {}, { retentionMs: DAY });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("shows an unfinished key's point, lease and runner, then its saved answer once done", async () => {
    const pay = { amount_cents: 800, currency: "eur" };
    const c = claimOf("acct", "inspect-me", pay);
    const claimedAt = w.now.ms;
    await expect(w.runner({ faults: crashAt("after-external") }).run(c, pay)).rejects.toBeInstanceOf(
      SimulatedCrashError,
    );
    const open = await w.store.inspect("acct", "inspect-me");
    expect(open).toMatchObject({
      scope: "acct",
      key: "inspect-me",
      state: "in_progress",
      recoveryPoint: "started",
      runner: "payments",
      saved: null,
      fingerprint: Buffer.from(c.fingerprint).toString("hex"),
    });
    // Created at the database's now (read when the claim ran), kept for a day.
    expect(Math.abs(open!.createdAt.getTime() - claimedAt)).toBeLessThan(2_000);
    expect(open!.expiresAt.getTime() - open!.createdAt.getTime()).toBe(DAY);
    expect(open?.lease?.until.getTime()).toBeGreaterThan(w.now.ms);
    // The reference names this claim of the key (a claim again after expiry is another operation).
    expect(w.store.refs.decode(open!.ref)).toEqual({
      scope: "acct",
      key: "inspect-me",
      claimId: open!.claimId,
    });

    w.now.ms += 31_000;
    const out = await w.runner().run(c, pay);
    const done = await w.store.inspect("acct", "inspect-me");
    expect(done).toMatchObject({ state: "done", recoveryPoint: "done", lease: null });
    expect(done?.saved).toEqual({
      status: 201,
      headers: [["content-type", "application/json"]],
      bodyBytes: text(out.response).length,
    });
    expect(done?.phaseData).toMatchObject({ chargeId: JSON.parse(text(out.response)).charge });
  });

  it("knows nothing of a key never claimed, of another scope's key, or of an expired one", async () => {
    expect(await w.store.inspect("acct", "never")).toBeUndefined();
    expect(await w.store.inspect("other-acct", "inspect-me")).toBeUndefined();
    w.now.ms += DAY + 1;
    expect(await w.store.inspect("acct", "inspect-me")).toBeUndefined();
  });
});
