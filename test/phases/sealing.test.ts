/**
 * Encryption at rest in phases mode (issue 13, "Sensitive inputs"): the stored input and the saved body
 * are sealed in the keys table (and in a review), and a takeover, the completer and a review all work
 * with the decrypted input.
 */
import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AesGcmSealer, isSealed, SealedValueError } from "../../src/core/index.ts";
import { complete } from "../../src/postgres/admin/complete.ts";
import { openReviews, SimulatedCrashError, settleReview } from "../../src/postgres/phases/index.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { crashAt } from "../../src/testing/faults.ts";
import {
  claimOf,
  LEASE_MS,
  openWorld,
  paymentsRunner,
  type RunnerOptions,
  serverOrEmbedded,
  text,
  type World,
} from "./helpers.ts";

const k1 = { id: "k1", key: randomBytes(32) };
const k2 = { id: "k2", key: randomBytes(32) };
/** An input whose every field is easy to spot in raw bytes. */
const input = (amount: number) => ({ amount_cents: amount, currency: "xts" });

describe.each(serverOrEmbedded)("phases with a sealer on $name", (backend) => {
  let w: World;
  let store: PostgresStore;
  const runner = (o: RunnerOptions = {}) => paymentsRunner(store, w.provider.url, o);
  const raw = async (key: string) =>
    (
      await w.db.query<{ request: unknown; body: Uint8Array | null }>(
        "SELECT request, body FROM idem.keys WHERE key = $1 AND NOT marker",
        [key],
      )
    ).rows[0]!;
  const expectSealedInput = (request: unknown) => {
    expect(typeof request).toBe("string");
    expect(request as string).toMatch(/^sealed:v1:/);
    expect(request as string).not.toContain("amount_cents");
  };

  beforeAll(async () => {
    w = await openWorld(backend);
    store = await PostgresStore.open(w.db, { timeShift: w.now, sealer: new AesGcmSealer([k1]) });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("seals the stored input and the saved body, and replays the reply byte for byte", async () => {
    const c = claimOf("acct", "p-sealed", input(700));
    const first = await runner().run(c, input(700));
    expect(first.response.status).toBe(201);
    const row = await raw("p-sealed");
    expectSealedInput(row.request);
    expect(isSealed(row.body)).toBe(true);
    expect(Buffer.from(row.body!).includes(Buffer.from("amount_cents"))).toBe(false);
    const again = await runner().run(c, input(700));
    expect(again.kind).toBe("replayed");
    expect(Buffer.from(again.response.body).equals(Buffer.from(first.response.body))).toBe(true);
  });

  it("a takeover resumes with the decrypted FIRST input, after k2 became current", async () => {
    const key = "p-takeover";
    const c = claimOf("acct", key, input(100));
    await expect(runner({ faults: crashAt("after-external") }).run(c, input(100))).rejects.toBeInstanceOf(
      SimulatedCrashError,
    );
    expectSealedInput((await raw(key)).request);
    w.now.ms += LEASE_MS + 1;
    // Rotation: k2 added (the old key kept for the values it sealed), the k1-only instance retired,
    // then k2 promoted: the store seals with it from then on.
    const before = store;
    store = await PostgresStore.open(w.db, { timeShift: w.now, sealer: new AesGcmSealer([k2, k1]) });
    await before.retire();
    await store.promoteSealingKey("k2");
    const out = await runner().run(c, input(5000)); // same fingerprint, another input: the first one wins
    expect(out.response.status).toBe(201);
    expect(JSON.parse(text(out.response))).toMatchObject({ amount_cents: 100 });
    const { rows } = await w.db.query("SELECT amount_cents FROM payments WHERE key = $1", [key]);
    expect(rows).toEqual([{ amount_cents: 100 }]);
    expect(
      Buffer.from((await raw(key)).body!)
        .subarray(6, 8)
        .toString(),
    ).toBe("k2");
  });

  it("seals the phase data whole (the charge id is not in clear), and the next phase reads it", async () => {
    const key = "p-data";
    const c = claimOf("acct", key, input(150));
    await expect(
      runner({ faults: crashAt("before-phase", { phase: "charged" }) }).run(c, input(150)),
    ).rejects.toBeInstanceOf(SimulatedCrashError);
    const chargeId = w.provider.charges().find((ch) => ch.amount === 150)!.id;
    const { rows } = await w.db.query<{ phase_data: unknown }>(
      "SELECT phase_data FROM idem.keys WHERE key = $1 AND NOT marker",
      [key],
    );
    const stored = rows[0]!.phase_data;
    expect(stored).toMatch(/^sealed:v1:/);
    expect(JSON.stringify(stored)).not.toContain("chargeId");
    expect(JSON.stringify(stored)).not.toContain(chargeId);
    expect((await store.inspect("acct", key))?.phaseData).toEqual({ chargeId });
    w.now.ms += LEASE_MS + 1;
    const out = await runner().run(c, input(150));
    expect(out.response.status).toBe(201);
    expect(JSON.parse(text(out.response))).toMatchObject({ charge: chargeId, amount_cents: 150 });
    expect(w.provider.charges().filter((ch) => ch.amount === 150)).toHaveLength(1);
  });

  it("an input sealed with a dropped key fails the takeover clearly, runs nothing and takes no lease", async () => {
    const key = "p-dropped";
    const c = claimOf("acct", key, input(400));
    const k3 = { id: "k3", key: randomBytes(32) };
    const old = await PostgresStore.open(w.db, { timeShift: w.now, sealer: new AesGcmSealer([k3]) });
    await expect(
      paymentsRunner(old, w.provider.url, { faults: crashAt("after-claim") }).run(c, input(400)),
    ).rejects.toBeInstanceOf(SimulatedCrashError);
    const dead = (await store.inspect("acct", key))?.lease;
    expect(dead).not.toBeNull();
    w.now.ms += LEASE_MS + 1;
    const err = await runner()
      .run(c, input(400))
      .catch((e) => e);
    expect(err).toBeInstanceOf(SealedValueError);
    expect(String(err.message)).toMatch(/key "k3", which is not configured/);
    expect((await store.inspect("acct", key))?.lease).toEqual(dead); // not taken over: still the dead worker's
    expect(w.provider.charges().filter((ch) => ch.amount === 400)).toHaveLength(0);
  });

  it("the completer finishes an abandoned key with its decrypted stored input", async () => {
    const key = "p-complete";
    const c = claimOf("acct", key, input(300));
    await expect(runner({ faults: crashAt("after-external") }).run(c, input(300))).rejects.toBeInstanceOf(
      SimulatedCrashError,
    );
    w.now.ms += LEASE_MS + 120_000;
    const report = await complete({ store, runners: [runner()], olderThanMs: 60_000 });
    expect(report.results.find((r) => r.key === key)).toMatchObject({ result: "completed", status: 201 });
    const { rows } = await w.db.query("SELECT amount_cents FROM payments WHERE key = $1", [key]);
    expect(rows).toEqual([{ amount_cents: 300 }]);
    const claimId = (await store.inspect("acct", key))!.claimId;
    expect(w.provider.charges().filter((ch) => ch.idempotency_key === `acct:${claimId}`)).toHaveLength(1);
  });

  it("a review resumed with data keeps the phase data sealed, and the next phase reads it", async () => {
    const key = "p-review-resume";
    const c = claimOf("acct", key, input(950));
    w.provider.failNext("late");
    await expect(runner({ noIdempotency: "none", timeoutMs: 300 }).run(c, input(950))).rejects.toThrow();
    const chargeId = "ch_found_by_hand";
    await settleReview(store, "acct", key, { resume: "charged", data: { chargeId }, note: "found" }, "ops");
    const { rows } = await w.db.query<{ phase_data: unknown }>(
      "SELECT phase_data FROM idem.keys WHERE key = $1 AND NOT marker",
      [key],
    );
    expect(rows[0]!.phase_data).toMatch(/^sealed:v1:/);
    expect(JSON.stringify(rows[0]!.phase_data)).not.toContain(chargeId);
    const out = await runner().run(c, input(950));
    expect(out.response.status).toBe(201);
    expect(JSON.parse(text(out.response))).toMatchObject({ charge: chargeId, amount_cents: 950 });
  });

  it("a review shows the decrypted input and a settled answer is saved sealed", async () => {
    const key = "p-review";
    const c = claimOf("acct", key, input(900));
    w.provider.failNext("late");
    await expect(runner({ noIdempotency: "none", timeoutMs: 300 }).run(c, input(900))).rejects.toThrow();
    const reviewRaw = await w.db.query<{ request: unknown }>(
      "SELECT request FROM idem.reviews WHERE key = $1",
      [key],
    );
    expectSealedInput(reviewRaw.rows[0]!.request);
    const review = (await openReviews(store)).find((r) => r.key === key);
    expect(review?.request).toEqual(input(900));
    await settleReview(
      store,
      "acct",
      key,
      { answer: { status: 402, body: { error: "declined" } }, note: "n" },
      "ops",
    );
    expect(isSealed((await raw(key)).body)).toBe(true);
    const replay = await runner().run(c, input(900));
    expect(replay.kind).toBe("replayed");
    expect(replay.response.status).toBe(402);
    expect(JSON.parse(text(replay.response))).toEqual({ error: "declined" });
  });
});
