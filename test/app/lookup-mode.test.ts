/**
 * The service against a provider WITHOUT idempotency keys (PROVIDER_IDEMPOTENCY=false, lookup mode):
 * every charge request charges, so after a lost reply the service must search for its own reference
 * before it charges again. Lost replies from the provider (charged, reply cut; charged, reply late) and
 * lost replies to the client (the same request sent again), then the completer for a crashed worker:
 * one charge per key, every time.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { idemRunners, paymentPhasesRunner } from "../../app/payments-phases.ts";
import { complete } from "../../src/postgres/admin/complete.ts";
import { SimulatedCrashError } from "../../src/postgres/phases/index.ts";
import { crashAt } from "../../src/testing/faults.ts";
import { paymentClaim } from "../helpers/claim.ts";
import { backends } from "../helpers/db.ts";
import { pay, type RunningService, startService } from "./service.ts";

describe.each(backends.slice(-1))("the service in lookup mode on $name", (backend) => {
  let svc: RunningService;
  beforeAll(async () => {
    svc = await startService(backend, { paymentsMode: "phases", providerIdempotency: false });
  });
  afterAll(async () => {
    await svc?.stop();
  });

  /** Successful charges the provider made for this key's claim. */
  const chargesOf = async (key: string) => {
    const k = await svc.store.inspect("acct_demo_1", key);
    const ref = `acct_demo_1:${k?.claimId}`;
    return svc.provider!.charges().filter((c) => c.reference === ref && c.status === "succeeded");
  };

  it("the simulator really charges every request in this mode", async () => {
    const before = svc.provider!.charges().length;
    for (let i = 0; i < 2; i++) {
      await fetch(`${svc.providerUrl}/v1/charges`, {
        method: "POST",
        headers: { "content-type": "application/json", "idempotency-key": "same" },
        body: JSON.stringify({ amount: 1, currency: "eur" }),
      });
    }
    expect(svc.provider!.charges().length).toBe(before + 2);
  });

  it("pays through lost replies on both sides: one charge per key, every retry the same answer", async () => {
    const faults = ["drop", "late", "drop", "503", "drop"] as const;
    for (const fault of faults) {
      const key = randomUUID();
      svc.provider!.failNext(fault);
      const answers: Response[] = [];
      // The client's reply is lost too: it sends the same request again, several times.
      for (let i = 0; i < 4; i++) answers.push(await pay(svc.url, { key }));
      const statuses = answers.map((r) => r.status);
      expect(
        statuses.every((s) => s === 201 || s === 409 || s === 503),
        statuses.join(),
      ).toBe(true);
      let last = answers.at(-1)!;
      for (let i = 0; last.status !== 201 && i < 40; i++) {
        await new Promise((r) => setTimeout(r, 250));
        last = await pay(svc.url, { key });
      }
      expect(last.status, fault).toBe(201);
      expect(await chargesOf(key), fault).toHaveLength(1);
      const payments = await svc.count("SELECT count(*)::int AS n FROM payments WHERE id = $1", [
        (await last.json()).id,
      ]);
      expect(payments).toBe(1);
    }
  });

  it("the completer's runners read PROVIDER_IDEMPOTENCY=false: a crashed payment is searched, not charged again", async () => {
    const key = randomUUID();
    const job = { amount_cents: 4_100, currency: "eur" };
    const claim = paymentClaim("acct_demo_1", key, JSON.stringify(job));
    // A worker charges, then dies before it records the charge; its short lease runs out.
    const crashing = paymentPhasesRunner({
      store: svc.store,
      providerUrl: svc.providerUrl!,
      providerIdempotency: false,
      leaseMs: 300,
      faults: crashAt("after-external"),
    });
    await expect(crashing.run(claim, job)).rejects.toBeInstanceOf(SimulatedCrashError);
    expect(await chargesOf(key)).toHaveLength(1);
    await new Promise((r) => setTimeout(r, 400));
    const env = { ...process.env };
    process.env.PROVIDER_URL = svc.providerUrl;
    process.env.PROVIDER_IDEMPOTENCY = "false";
    try {
      const report = await complete({
        store: svc.store,
        runners: idemRunners({ store: svc.store }),
        olderThanMs: 0,
      });
      expect(report.results.find((r) => r.key === key)).toMatchObject({ result: "completed", status: 201 });
    } finally {
      process.env = env;
    }
    expect(await svc.store.inspect("acct_demo_1", key)).toMatchObject({ state: "done" });
    expect(await chargesOf(key)).toHaveLength(1);
  });
});
