/**
 * Issue 13 on the phases side: a takeover resumes with the input stored by the key's first request,
 * never its own; and with a retention shorter than a partition, a key reused after its expiry is new
 * (finished or abandoned, mid-partition or across a partition boundary), never 409 forever.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isKeyInFlightError } from "../../src/core/index.ts";
import { SimulatedCrashError } from "../../src/postgres/phases/index.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { crashAt } from "../../src/testing/faults.ts";
import {
  claimOf,
  LEASE_MS,
  openWorld,
  paymentsRunner,
  serverOrEmbedded,
  text,
  type World,
} from "./helpers.ts";

const RETENTION_MS = 10_000; // far shorter than the one-day partitions
const DAY = 86_400_000;

describe.each(serverOrEmbedded)("stored input and short retention on $name", (backend) => {
  let w: World;
  beforeAll(async () => {
    w = await openWorld(backend, {}, { retentionMs: RETENTION_MS });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("a takeover with another input under the same fingerprint finishes with the FIRST input", async () => {
    const key = "stored-input";
    const first = { amount_cents: 100, currency: "eur" };
    const claim = claimOf("acct", key, first); // the retry presents the same fingerprint (e.g. reordered fields)
    await expect(w.runner({ faults: crashAt("after-external") }).run(claim, first)).rejects.toBeInstanceOf(
      SimulatedCrashError,
    );
    w.now.ms += LEASE_MS + 1; // the dead worker's lease has run out
    // The lease (30 s) outlives this file's 10 s retention: take over through a long-retention store.
    const store = await PostgresStore.open(w.db, { timeShift: w.now, retentionMs: DAY });
    const out = await paymentsRunner(store, w.provider.url).run(claim, {
      amount_cents: 5000,
      currency: "eur",
    });
    expect(out.response.status).toBe(201);
    expect(JSON.parse(text(out.response))).toMatchObject({ amount_cents: 100 });
    const { rows } = await w.db.query<{ amount_cents: number }>(
      "SELECT amount_cents FROM payments WHERE key = $1",
      [key],
    );
    expect(rows).toEqual([{ amount_cents: 100 }]);
    const claimId = (await store.inspect("acct", key))!.claimId;
    const charges = w.provider.charges().filter((c) => c.idempotency_key === `acct:${claimId}`);
    expect(charges.map((c) => c.amount)).toEqual([100]);
  });

  it("a finished key reused after its expiry, inside the same partition, runs again", async () => {
    w.now.ms = Date.UTC(2030, 4, 10, 12);
    const pay = { amount_cents: 300, currency: "eur" };
    const c = claimOf("acct", "reused-done", pay);
    const runner = w.runner();
    expect((await runner.run(c, pay)).kind).toBe("executed");
    w.now.ms += 5_000;
    expect((await runner.run(c, pay)).kind).toBe("replayed");
    const firstClaim = (await w.store.inspect("acct", "reused-done"))!.claimId!;
    w.now.ms += RETENTION_MS;
    const again = await runner.run(c, pay);
    expect(again.kind).toBe("executed");
    expect(again.response.status).toBe(201);
    expect(await w.counts("reused-done")).toMatchObject({ payments: 2 });
    // Each claim is a new downstream operation: a new claim id, time-ordered (UUIDv7) so that the
    // history's index on it is appended to, not written at random.
    const secondClaim = (await w.store.inspect("acct", "reused-done"))!.claimId!;
    for (const id of [firstClaim, secondClaim])
      expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab]/);
    expect(secondClaim > firstClaim).toBe(true);
    const keys = w.provider.charges().map((charge) => charge.idempotency_key);
    expect(keys).toContain(`acct:${firstClaim}`);
    expect(keys).toContain(`acct:${secondClaim}`);
  });

  it("an abandoned key (lease held by a dead worker) reused after its expiry is new, not 409", async () => {
    w.now.ms = Date.UTC(2030, 4, 11, 12);
    const pay = { amount_cents: 400, currency: "eur" };
    const c = claimOf("acct", "reused-abandoned", pay);
    await expect(w.runner({ faults: crashAt("after-claim") }).run(c, pay)).rejects.toBeInstanceOf(
      SimulatedCrashError,
    );
    w.now.ms += 1_000;
    expect(
      isKeyInFlightError(
        await w
          .runner()
          .run(c, pay)
          .catch((e) => e),
      ),
    ).toBe(true);
    w.now.ms += RETENTION_MS; // past the retention, well inside the dead worker's 30 s lease
    const out = await w.runner().run(c, pay);
    expect(out).toMatchObject({ kind: "executed", saved: true });
    expect(out.response.status).toBe(201);
  });

  it("across a partition boundary: the new claim's marker replaces the expired row of the old partition", async () => {
    const boundary = Date.UTC(2030, 4, 13); // a partition starts here
    w.now.ms = boundary - 3_000;
    const pay = { amount_cents: 500, currency: "eur" };
    const c = claimOf("acct", "reused-boundary", pay);
    await expect(w.runner({ faults: crashAt("after-claim") }).run(c, pay)).rejects.toBeInstanceOf(
      SimulatedCrashError,
    );
    w.now.ms = boundary + RETENTION_MS; // expired; the claim falls in the new partition's first minutes
    const out = await w.runner().run(c, pay);
    expect(out).toMatchObject({ kind: "executed", saved: true });
    const { rows } = await w.db.query<{ marker: boolean; bucket: number }>(
      "SELECT marker, bucket FROM idem.keys WHERE scope = 'acct' AND key = 'reused-boundary' ORDER BY bucket",
    );
    expect(rows.map((r) => r.marker)).toEqual([true, false]);
    expect((await w.runner().run(c, pay)).kind).toBe("replayed");
  });
});
