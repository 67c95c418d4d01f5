/**
 * Issue 17: a provider WITHOUT idempotency keys (the simulator with `idempotency: false`: every request
 * charges). The phase sends our reference and declares how to look its effect up; after an unknown
 * outcome the runner looks before it calls again; what nothing can settle goes to review, answers 409
 * operation-uncertain, is left alone by the completer and is settled by a person, on the record.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  isOperationUncertainError,
  isRetryableError,
  type OperationUncertainError,
} from "../../src/core/index.ts";
import { complete } from "../../src/postgres/admin/complete.ts";
import {
  openReviews,
  reviewGauge,
  SimulatedCrashError,
  settleKey,
  settleReview,
} from "../../src/postgres/phases/index.ts";
import { crashAt } from "../../src/testing/faults.ts";
import {
  claimOf,
  downstreamKeys,
  LEASE_MS,
  openWorld,
  serverOrEmbedded,
  text,
  type World,
} from "./helpers.ts";

const PAY = { amount_cents: 2_000, currency: "eur" };

describe.each(serverOrEmbedded)("a provider without idempotency keys, on $name", (backend) => {
  let w: World;
  beforeAll(async () => {
    w = await openWorld(backend, { idempotency: false });
  });
  afterAll(async () => {
    await w?.close();
  });
  /** The charges made under the references of `key`'s claims (they name the claim, not the key). */
  const charges = async (key: string) => {
    const refs = new Set(await downstreamKeys(w.db, key));
    return w.provider.charges().filter((c) => refs.has(c.reference ?? ""));
  };

  it("the simulator really charges twice for a repeated key in this mode", async () => {
    const { chargeProvider } = await import("../../src/testing/provider-client.ts");
    for (let i = 0; i < 2; i++) {
      const r = await chargeProvider(w.provider.url, {
        amount: 1,
        currency: "eur",
        idempotencyKey: "k",
        reference: "acct:raw",
      });
      expect(r).toMatchObject({ kind: "charged", replayed: false });
    }
    expect(w.provider.charges().filter((c) => c.reference === "acct:raw")).toHaveLength(2);
  });

  it("a lost reply after the charge: the runner looks, finds the charge, and answers 201 at once", async () => {
    w.provider.failNext("drop");
    const out = await w.runner({ noIdempotency: "search" }).run(claimOf("acct", "dropped", PAY), PAY);
    expect(out.response.status).toBe(201);
    expect(await charges("dropped")).toHaveLength(1);
    expect(JSON.parse(text(out.response)).charge).toBe((await charges("dropped"))[0]!.id);
  });

  it("a timeout after the provider charged: found by the lookup, one charge", async () => {
    w.provider.failNext("late");
    const out = await w
      .runner({ noIdempotency: "search", timeoutMs: 300 })
      .run(claimOf("acct", "late", PAY), PAY);
    expect(out.response.status).toBe(201);
    expect(await charges("late")).toHaveLength(1);
    expect(await w.counts("late")).toMatchObject({ payments: 1, receipts: 1 });
  });

  it("a crash after the call: the takeover looks instead of calling again", async () => {
    const c = claimOf("acct", "crashed", PAY);
    await expect(
      w.runner({ noIdempotency: "search", faults: crashAt("after-external") }).run(c, PAY),
    ).rejects.toBeInstanceOf(SimulatedCrashError);
    const before = w.provider.requests();
    w.now.ms += LEASE_MS + 1;
    const out = await w.runner({ noIdempotency: "search" }).run(c, PAY);
    expect(out.response.status).toBe(201);
    expect(w.provider.requests()).toBe(before); // no second charge request
    expect(await charges("crashed")).toHaveLength(1);
  });

  it("a 503 before any charge: the lookup finds nothing, the retry charges once", async () => {
    const c = claimOf("acct", "unavailable", PAY);
    w.provider.failNext("503");
    const first = await w
      .runner({ noIdempotency: "search" })
      .run(c, PAY)
      .catch((e) => e);
    expect(isRetryableError(first)).toBe(true);
    const out = await w.runner({ noIdempotency: "search" }).run(c, PAY);
    expect(out.response.status).toBe(201);
    expect(await charges("unavailable")).toHaveLength(1);
  });

  it("when the search is down too: review after N lookups, 409 uncertain, settled by a person", async () => {
    const key = "unknowable";
    const c = claimOf("acct", key, PAY);
    const runner = w.runner({ noIdempotency: "search", timeoutMs: 300, maxLookupFailures: 3 });
    w.provider.setSearch(false);
    w.provider.failNext("late");
    const errors: unknown[] = [];
    for (let i = 0; i < 4; i++) errors.push(await runner.run(c, PAY).catch((e) => e));
    expect(errors.slice(0, 2).every(isRetryableError)).toBe(true);
    expect(errors.slice(2).every(isOperationUncertainError)).toBe(true);
    // The reference names this claim of the key (the one a person settles).
    const inspected = await w.store.inspect("acct", key);
    expect(w.store.refs.decode((errors[3] as OperationUncertainError).operationRef)).toEqual({
      scope: "acct",
      key,
      claimId: inspected?.claimId,
    });
    expect(await charges(key)).toHaveLength(1); // charged once, never again while nobody could tell
    expect(inspected).toMatchObject({
      state: "needs_review",
      recoveryPoint: "started",
    });
    expect(await reviewGauge(w.store)).toMatchObject({ open: 1 });
    const [review] = await openReviews(w.store);
    expect(review).toMatchObject({ scope: "acct", key, recoveryPoint: "started", settledAt: null });
    expect(review?.reason).toMatch(/3 lookups could not tell/);

    // The completer leaves it to the person, however old it gets.
    w.now.ms += LEASE_MS + 120_000;
    const report = await complete({ store: w.store, runners: [runner], olderThanMs: 0 });
    expect(report.results.find((r) => r.key === key)).toBeUndefined();

    // The person finds the charge at the provider and resumes the key after it, on the record.
    w.provider.setSearch(true);
    const chargeId = (await charges(key))[0]!.id;
    const settled = await settleReview(
      w.store,
      "acct",
      key,
      { resume: "charged", data: { chargeId }, note: `found ${chargeId} in the provider dashboard` },
      "ops@example",
    );
    expect(settled).toMatchObject({ settledBy: "ops@example", settlement: { resume: "charged" } });
    expect(await reviewGauge(w.store)).toMatchObject({ open: 0 });
    const done = await complete({ store: w.store, runners: [runner], olderThanMs: 0 });
    expect(done.results.find((r) => r.key === key)).toMatchObject({ result: "completed", status: 201 });
    expect(await charges(key)).toHaveLength(1);
    expect(await w.counts(key)).toMatchObject({ payments: 1, receipts: 1 });
  });

  it("no lookup at all: an unknown outcome goes to review at once; a settled answer is replayed", async () => {
    const key = "no-lookup";
    const c = claimOf("acct", key, PAY);
    w.provider.failNext("late");
    const err = await w
      .runner({ noIdempotency: "none", timeoutMs: 300 })
      .run(c, PAY)
      .catch((e) => e);
    expect(isOperationUncertainError(err)).toBe(true);
    expect(
      await w
        .runner({ noIdempotency: "none" })
        .run(c, PAY)
        .catch((e) => e),
    ).toBeInstanceOf(err.constructor);
    await settleReview(
      w.store,
      "acct",
      key,
      { answer: { status: 402, body: { error: "refunded after review" } }, note: "refunded by hand" },
      "ops",
    );
    const out = await w.runner({ noIdempotency: "none" }).run(c, PAY);
    expect(out.kind).toBe("replayed");
    expect(out.response.status).toBe(402);
    expect(JSON.parse(text(out.response))).toEqual({ error: "refunded after review" });
    expect(await charges(key)).toHaveLength(1);
  });
});

it("settleKey stays a deprecated alias of settleReview for one release", () => {
  expect(settleKey).toBe(settleReview);
});
