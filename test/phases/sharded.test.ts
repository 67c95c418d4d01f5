/**
 * Phases mode on a ShardedStore over two databases: each account's key, lease, payment row and receipt
 * live in its own shard; retries replay there; a crashed payment is resumed there by the completer,
 * which scans every shard.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { complete } from "../../src/postgres/admin/complete.ts";
import { SimulatedCrashError } from "../../src/postgres/phases/index.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { ShardedStore } from "../../src/postgres/sharded.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { crashAt } from "../../src/testing/faults.ts";
import { type Provider, startProvider } from "../../src/testing/provider.ts";
import type { OpenDb } from "../helpers/db.ts";
import { TestTime } from "../helpers/time.ts";
import { claimOf, LEASE_MS, paymentsRunner, serverOrEmbedded, text } from "./helpers.ts";

describe.each(serverOrEmbedded)("phases on a ShardedStore on $name", (backend) => {
  const dbs: OpenDb[] = [];
  let provider: Provider;
  let store: ShardedStore;
  const now = new TestTime(Date.UTC(2031, 2, 3, 12));

  beforeAll(async () => {
    const shards: Record<string, PostgresStore> = {};
    for (const name of ["eu1", "eu2"]) {
      const open = await backend.open();
      dbs.push(open);
      await migrate(open.db);
      await open.db.exec(`CREATE TABLE payments (
        id serial PRIMARY KEY, charge_id text NOT NULL, scope text NOT NULL, key text NOT NULL,
        amount_cents int NOT NULL)`);
      shards[name] = await PostgresStore.open(open.db, { timeShift: now });
    }
    store = new ShardedStore({ shards, route: (scope) => (scope.endsWith("-1") ? "eu1" : "eu2") });
    provider = await startProvider({ seed: 11 });
  });
  afterAll(async () => {
    await provider?.close();
    for (const d of dbs) await d.close();
  });

  const rowsOf = async (i: number, key: string) => {
    const { rows } = await dbs[i]!.db.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM payments WHERE key = $1",
      [key],
    );
    return rows[0]!.n;
  };

  it("runs each account's payment on its own shard, and replays it there", async () => {
    const runner = paymentsRunner(store, provider.url);
    const pay = { amount_cents: 900, currency: "eur" };
    const a = await runner.run(claimOf("acct-1", "k", pay), pay);
    const b = await runner.run(claimOf("acct-2", "k", pay), pay);
    expect([a.response.status, b.response.status]).toEqual([201, 201]);
    expect(text(a.response)).not.toBe(text(b.response)); // two accounts, two charges
    expect([await rowsOf(0, "k"), await rowsOf(1, "k")]).toEqual([1, 1]);
    // inspect routes by scope too: each account's key is found on its own shard.
    expect(await store.inspect("acct-1", "k")).toMatchObject({ state: "done", saved: { status: 201 } });
    expect(await store.shards.eu2!.inspect("acct-1", "k")).toBeUndefined();
    const again = await runner.run(claimOf("acct-1", "k", pay), pay);
    expect(again.kind).toBe("replayed");
    expect(text(again.response)).toBe(text(a.response));
  });

  it("resumes a crashed payment on its shard through the completer", async () => {
    const pay = { amount_cents: 1200, currency: "eur" };
    const crashing = paymentsRunner(store, provider.url, { faults: crashAt("after-external") });
    await expect(crashing.run(claimOf("acct-2", "crashed", pay), pay)).rejects.toBeInstanceOf(
      SimulatedCrashError,
    );
    now.ms += LEASE_MS + 61_000;
    const report = await complete({ store, runners: [paymentsRunner(store, provider.url)] });
    expect(report.results).toMatchObject([
      { scope: "acct-2", key: "crashed", result: "completed", status: 201 },
    ]);
    expect([await rowsOf(0, "crashed"), await rowsOf(1, "crashed")]).toEqual([0, 1]);
    const claimId = (await store.inspect("acct-2", "crashed"))!.claimId;
    expect(provider.charges().filter((c) => c.idempotency_key === `acct-2:${claimId}`)).toHaveLength(1);
  });
});
