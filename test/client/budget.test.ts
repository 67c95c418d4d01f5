/**
 * The retry budget: retries can add only about `ratio` extra load, however bad the outage.
 */
import { describe, expect, it } from "vitest";
import { createClient, isRetryBudgetExhaustedError, RetryBudget } from "../../src/client/index.ts";
import { refusedError } from "./helpers.ts";

describe("retry budget", () => {
  it("starts full, spends one token per retry and earns the ratio per first attempt, up to the cap", () => {
    const budget = new RetryBudget({ ratio: 0.5, cap: 2 });
    expect(budget.tokens).toBe(2);
    expect(budget.tryRetry()).toBe(true);
    expect(budget.tryRetry()).toBe(true);
    expect(budget.tryRetry()).toBe(false);
    budget.recordRequest();
    expect(budget.tryRetry()).toBe(false); // 0.5 is not a whole token
    budget.recordRequest();
    expect(budget.tryRetry()).toBe(true);
    for (let i = 0; i < 10; i++) budget.recordRequest();
    expect(budget.tokens).toBe(2);
  });

  it("in a simulated full outage, 1,000 requests wanting 2 retries each get about 10% extra (109)", () => {
    const budget = new RetryBudget(); // ratio 0.1, cap 10
    let retries = 0;
    for (let request = 0; request < 1000; request++) {
      budget.recordRequest();
      for (let wanted = 0; wanted < 2; wanted++) if (budget.tryRetry()) retries++;
    }
    console.log(`retry budget, full outage: 1000 requests x 2 wanted retries -> ${retries} retries`);
    expect(retries).toBe(109);
  });

  it("the client, through a full outage, sends 1,000 first attempts and only ~109 retries", async () => {
    let sent = 0;
    let budgetRefusals = 0;
    const client = createClient({
      baseUrl: "http://payments.invalid",
      fetch: async () => {
        sent++;
        throw refusedError();
      },
      breaker: false, // the budget alone, here
      maxAttempts: 3,
      retry: { baseMs: 0 },
    });
    for (let i = 0; i < 1000; i++) {
      await client.post("/payments", { i }).catch((err) => {
        if (isRetryBudgetExhaustedError(err)) budgetRefusals++;
      });
    }
    const retries = sent - 1000;
    console.log(
      `client, full outage: 1000 calls, ${sent} attempts, ${retries} retries (${((retries / 1000) * 100).toFixed(1)}% extra load)`,
    );
    expect(retries).toBe(109);
    expect(budgetRefusals).toBeGreaterThan(900);
  });

  it("a budget can be shared by several clients", async () => {
    const budget = new RetryBudget({ ratio: 0, cap: 1 });
    let sent = 0;
    const failing = async () => {
      sent++;
      throw refusedError();
    };
    const a = createClient({ fetch: failing, budget, breaker: false, retry: { baseMs: 0 } });
    const b = createClient({ fetch: failing, budget, breaker: false, retry: { baseMs: 0 } });
    await expect(a.post("http://x.invalid/p", {})).rejects.toMatchObject({
      code: "IDEM_RETRY_BUDGET_EXHAUSTED",
      attempts: 2,
    });
    await expect(b.post("http://x.invalid/p", {})).rejects.toMatchObject({
      code: "IDEM_RETRY_BUDGET_EXHAUSTED",
      attempts: 1,
    });
    expect(sent).toBe(3);
  });
});
