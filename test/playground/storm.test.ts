/**
 * The playground's retry-storm calculator in Chromium (playwright-core, Debian's chromium): the formula
 * as a person changes the numbers (3 attempts at 3 layers: 27 calls for one tap when the bottom is
 * dead, about 5% more at 5% failures), and the live mode, which sends real taps through real
 * `idem/client` layers to the real service: measured 9 calls per tap at 2 x 3 attempts over a dead
 * bottom without a budget, far fewer with one, and exactly one payment per tap that succeeded.
 */
import type { Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { attemptsOf, storm } from "../../app/playground/storm-formula.js";
import { type RunningService, startService } from "../app/service.ts";
import { haveChromium, type OpenBrowser, openChromium } from "../helpers/chromium.ts";
import { backends } from "../helpers/db.ts";

const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;

describe("the retry-storm formula", () => {
  it("gives the specification's numbers", () => {
    expect(storm({ attempts: [3, 3, 3], p: 1 }).loadPerTap).toBe(27);
    const five = storm({ attempts: [3, 3, 3], p: 0.05 });
    expect(five.loadPerTap).toBeCloseTo(1 / 0.95, 6); // a few percent of extra load...
    expect(five.failures).toBeLessThan(1e-30); // ...hides almost every failure
    expect(storm({ attempts: [3, 3, 3], p: 1, budget: 0.1 }).loadPerTap).toBeCloseTo(1.331, 6);
    expect(storm({ attempts: attemptsOf("3,1", 3), p: 1 }).loadPerTap).toBe(3); // retry at one layer
  });
});

describe.skipIf(!haveChromium)("the retry-storm calculator in Chromium", () => {
  let svc: RunningService;
  let browser: OpenBrowser;
  let page: Page;
  const text = async (id: string) => (await page.getByTestId(id).textContent()) ?? "";
  const set = async (id: string, value: string) => page.getByTestId(id).fill(value);

  beforeAll(async () => {
    svc = await startService(backend, { paymentsMode: "phases", playground: true });
    browser = await openChromium();
    page = browser.page;
    await page.goto(`${svc.url}/`);
  });
  afterAll(async () => {
    await browser?.close();
    await svc?.stop();
  });

  it("computes the load and the failures users see as the numbers change", async () => {
    await set("storm-layers", "3");
    await set("storm-attempts", "3");
    await set("storm-failure", "100");
    expect(await text("storm-failure-out")).toBe("100%");
    expect(await text("storm-load")).toBe("27.0");
    expect(await text("storm-fail")).toBe("100.0%");
    expect(await text("storm-load-budget")).toBe("1.33");
    await set("storm-failure", "5");
    expect(await text("storm-load")).toBe("1.05");
    expect(await text("storm-fail")).toMatch(/^0\.0+%$/);
    await set("storm-attempts", "3,1,1"); // retry at the app only: the layers below fail fast
    await set("storm-failure", "100");
    expect(await text("storm-load")).toBe("3.00");
    expect(await page.getByTestId("storm-curve").getAttribute("d")).toMatch(/^M48\.0,/);
  });

  it("live: a dead bottom gets 9 calls per tap through 2 x 3 attempts, far fewer with the budget", async () => {
    await set("storm-layers", "2");
    await set("storm-attempts", "3");
    await set("storm-failure", "100");
    await set("storm-budget", "10");
    await set("storm-taps", "20");
    await page.getByTestId("storm-run").click();
    await expect.poll(() => text("storm-measured-load"), { timeout: 60_000 }).not.toBe("-");
    expect(await text("storm-load")).toBe("9.00");
    expect(await text("storm-measured-load")).toBe("9.00");
    expect(Number(await text("storm-measured-load-budget"))).toBeLessThan(3);
    expect(await text("storm-measured-fail")).toBe("100.0%");
    expect(await text("storm-payments")).toBe("0 of 20");
    expect(await page.getByTestId("storm-point").count()).toBe(1);
  });

  it("refuses a live run that could flood the service", async () => {
    const res = await fetch(`${svc.url}/playground/api/storm`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ attempts: [5, 5, 5, 5, 5], failure: 1, budget: 0, taps: 200 }),
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { detail: string }).detail).toMatch(
      /^Up to 625000 calls could reach the bottom/,
    );
  });

  it("live: at 50% failures every tap that succeeds made exactly one payment", async () => {
    await set("storm-failure", "50");
    await set("storm-taps", "40");
    await page.getByTestId("storm-run").click();
    await expect.poll(() => text("storm-measured-load"), { timeout: 60_000 }).not.toBe("-");
    for (const suffix of ["", "-budget"]) {
      const failed = Number((await text(`storm-measured-fail${suffix}`)).replace("%", "")) / 100;
      const [made, of] = (await text(`storm-payments${suffix}`)).split(" of ").map(Number);
      expect(of).toBe(40);
      expect(made).toBe(Math.round(40 * (1 - failed)));
    }
    // One payment row per tap key, never two (the retries through both layers reused the key).
    const { rows } = await svc.open.db.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM (SELECT idempotency_key FROM payments WHERE idempotency_key LIKE 'storm-%' GROUP BY 1 HAVING count(*) > 1) d",
    );
    expect(rows[0]!.n).toBe(0);
  });
});
