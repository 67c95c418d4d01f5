/**
 * A lost reply's retry only learns an outcome the server already has, so the retry budget never
 * refuses it (issue 57): 200 concurrent calls with the client's default budget through the fault
 * proxy (src/testing/verify/proxy.ts) in front of the reference service in phases mode, the proxy
 * losing each key's first reply. Dropped replies are free retries already; held ones end in the
 * client's per-try timeout, which spends budget: once it is spent, the client asks the operation
 * lookup (a read) instead of giving up. 200 of 200 end with their 201, one payment and one charge each.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createClient } from "../../src/client/index.ts";
import { type ProxyFault, startFaultProxy } from "../../src/testing/verify/proxy.ts";
import { KEY_1, type RunningService, startService } from "../app/service.ts";
import { backends } from "../helpers/db.ts";

const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;
const CALLS = 200;

describe(`200 concurrent calls whose first reply is lost, on the service (${backend.name})`, () => {
  let svc: RunningService;
  beforeAll(async () => {
    svc = await startService(backend, { paymentsMode: "phases" });
  });
  afterAll(async () => {
    await svc?.stop();
  });

  it.each<[ProxyFault, number]>([
    ["drop", 10_000],
    ["hold", 1_500],
  ])(
    "the proxy's %s: 200 of 200 answered 201 with their own payment, one charge each",
    async (fault, perTry) => {
      const proxy = await startFaultProxy({ target: svc.url, holdMs: 60_000 });
      const gaveUp: string[] = [];
      try {
        const client = createClient({
          baseUrl: proxy.url,
          headers: { authorization: `Bearer ${KEY_1}` },
          perTryTimeoutMs: perTry, // the budget and everything else: the defaults
          on: { giveUp: (e) => gaveUp.push(e.error.name) },
        });
        const keys = Array.from({ length: CALLS }, () => randomUUID());
        for (const key of keys) proxy.inject(key, fault);
        const charges = svc.provider!.charges().length;
        const results = await Promise.allSettled(
          keys.map(async (key, i) => {
            const intent = await client.intent(undefined, { key });
            const res = await client.post(
              "/v1/payments",
              { amount_cents: 1_000 + i, currency: "eur" },
              { intent: intent.id },
            );
            return { status: res.status, body: (await res.json()) as { id: string; amount_cents: number } };
          }),
        );
        const failed = results.filter((r) => r.status === "rejected").map((r) => String(r.reason?.name));
        expect(failed).toEqual([]);
        const answers = results.map(
          (r) => (r as PromiseFulfilledResult<{ status: number; body: any }>).value,
        );
        expect(answers.map((a) => a.status).filter((s) => s !== 201)).toEqual([]);
        // Each call got its own payment back.
        expect(answers.map((a) => a.body.amount_cents)).toEqual(keys.map((_, i) => 1_000 + i));
        expect(new Set(answers.map((a) => a.body.id)).size).toBe(CALLS);
        expect(gaveUp).toEqual([]);
        const stats = proxy.stats();
        expect(fault === "drop" ? stats.dropped : stats["timed-out"]).toBe(CALLS); // every first reply lost
        expect(svc.provider!.charges().length - charges).toBe(CALLS);
        const paid = await svc.count(
          `SELECT count(*)::int AS n FROM payments WHERE amount_cents >= 1000 AND amount_cents < ${1_000 + CALLS}`,
        );
        expect(paid).toBe(CALLS);
        await svc.open.db.query("DELETE FROM payments WHERE amount_cents >= 1000");
        console.log(
          `${fault}: ${CALLS} of ${CALLS} answered 201; proxy ${JSON.stringify(stats)}; budget left ${client.budget?.tokens.toFixed(1)}`,
        );
      } finally {
        await proxy.close();
      }
    },
    120_000,
  );
});
