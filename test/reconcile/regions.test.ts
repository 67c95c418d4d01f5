/**
 * "Accept rare duplicates and reconcile" (docs/operations.md, Several regions, option 3), for real: two
 * regions of the reference service, each on its own database, no home-region routing, one provider.
 * A payment's reply is lost in region A and the retry lands in region B, which has not heard of the key:
 * both charge. `idem reconcile` reads both regions' payments, finds one operation charged under two
 * references, and refunds the second charge at once (it is under the operator's limit), exactly once,
 * however often it runs; a larger double waits for a person instead.
 */
import { readFile } from "node:fs/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ApiKeys, ensureDemoAccounts } from "../../app/accounts.ts";
import { createApp } from "../../app/app.ts";
import { prepareSchema } from "../../app/database.ts";
import { createLogger } from "../../app/observability.ts";
import type { Db } from "../../src/postgres/db.ts";
import { openReviews, settleReview } from "../../src/postgres/phases/index.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import {
  FindingKind,
  httpRefunder,
  parseMapping,
  parseReport,
  reconcile,
  recordsFromSql,
} from "../../src/reconcile/index.ts";
import { type Provider, startProvider } from "../../src/testing/provider.ts";
import { KEY_1 } from "../app/service.ts";
import { backends, type OpenDb } from "../helpers/db.ts";

const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;
const CONFIG = JSON.parse(await readFile(new URL("../../app/reconcile.json", import.meta.url), "utf8"));

interface Region {
  open: OpenDb;
  store: PostgresStore;
  fetch: (r: Request) => Response | Promise<Response>;
}

describe(`two regions without routing, reconciled (${backend.name})`, () => {
  let provider: Provider;
  let a: Region;
  let b: Region;
  const start = new Date(Date.now() - 1_000);

  const region = async (): Promise<Region> => {
    const open = await backend.open();
    await prepareSchema(open.db);
    await ensureDemoAccounts(open.db);
    const store = await PostgresStore.open(open.db);
    const app = createApp({
      db: open.db,
      store,
      apiKeys: new ApiKeys(open.db),
      providerUrl: provider.url,
      logger: createLogger({ level: "silent" }),
      metricsEndpoint: false,
    });
    return { open, store, fetch: (r) => app.fetch(r) };
  };
  const pay = (r: Region, key: string, amount: number) =>
    r.fetch(
      new Request("http://region.internal/v1/payments", {
        method: "POST",
        headers: {
          authorization: `Bearer ${KEY_1}`,
          "idempotency-key": key,
          "content-type": "application/json",
        },
        body: JSON.stringify({ amount_cents: amount, currency: "eur" }),
      }),
    );
  const run = async () => {
    const text = await (await fetch(`${provider.url}/v1/reports/charges?format=csv`)).text();
    const sources = [a.open.db, b.open.db].map((db: Db) => recordsFromSql(db, CONFIG.records));
    return reconcile({
      store: a.store, // the job's own records (findings, refunds' keys) live in region A
      charges: parseReport(text, parseMapping(CONFIG.report)),
      records: async (w) => (await Promise.all(sources.map((s) => s(w)))).flat(),
      from: start,
      to: new Date(Date.now() + 60_000),
      refund: httpRefunder(provider.url),
      autoRefund: { maxAmount: 500 },
      review: true,
    });
  };

  beforeAll(async () => {
    provider = await startProvider();
    a = await region();
    b = await region();
  });
  afterAll(async () => {
    await a?.open.close();
    await b?.open.close();
    await provider?.close();
  });

  it("the retry that lands in the other region charges again; reconcile refunds the double once", async () => {
    expect((await pay(a, "tap-1", 450)).status).toBe(201); // its reply is lost on the way back
    expect((await pay(b, "tap-1", 450)).status).toBe(201); // B has no row for tap-1 yet
    expect(provider.charges().filter((c) => c.amount === 450)).toHaveLength(2);

    const first = await run();
    expect(first.findings.map((f) => [f.kind, f.state])).toEqual([[FindingKind.duplicate, "refunded"]]);
    const [double] = first.findings;
    expect(double!.detail).toMatch(/operation acct_demo_1:tap-1 was charged under two references/);
    const { rows } = await b.open.db.query<{ provider_ref: string }>(
      "SELECT provider_ref FROM payments WHERE idempotency_key = 'tap-1'",
    );
    expect(double!.reference).toBe(rows[0]!.provider_ref); // B's charge is the one refunded
    expect(provider.refunds().map((r) => [r.charge, r.amount])).toEqual([[double!.chargeId, 450]]);

    const again = await run();
    expect(again.findings).toEqual([]); // the double no longer holds money: not a difference
    expect(provider.refunds()).toHaveLength(1);
  });

  it("a double above the limit waits for a person; settled 'resume at refund', the next run refunds it once", async () => {
    await pay(a, "tap-2", 9_000);
    await pay(b, "tap-2", 9_000);
    const r = await run();
    const f = r.findings.find((x) => x.kind === FindingKind.duplicate)!;
    expect(f.state).toBe("review");
    expect(provider.refunds()).toHaveLength(1);
    // In the console's queue, under the account, with the finding as the reason.
    const [review] = (await openReviews(a.store)).filter((v) => v.runner === "reconcile");
    expect(review).toMatchObject({ scope: "acct_demo_1", key: f.actionKey, recoveryPoint: "decide" });
    await settleReview(
      a.store,
      review!.scope,
      review!.key,
      { resume: "refund", note: "checked: a double" },
      "bo@ops",
    );
    const after = await run();
    expect(after.refunded.map((x) => x.id)).toContain(f.id);
    expect(provider.refunds().map((x) => [x.charge, x.amount])).toContainEqual([f.chargeId, 9_000]);
    await run();
    expect(provider.refunds()).toHaveLength(2);
  });
});
