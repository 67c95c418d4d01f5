/**
 * The playground page, end to end: the real service (phases mode, the provider simulator over HTTP) and
 * Debian's Chromium driven by playwright-core. A person's clicks: lose the reply then retry, crash after
 * the provider charged then retry, wrong body on a reused key, double-tap, a slow worker whose lease
 * expires (the page prompts a retry during the stall). After each, what the page shows is checked
 * against the database and the provider's charges. Then the page at a phone's width (390 px) must not
 * scroll sideways. Takes screenshots at both sizes into test-results/; with UPDATE_SCREENSHOTS=1 into
 * docs/images/ instead, the README's (a run of the suite leaves the tracked files alone).
 */
import { mkdirSync, statSync } from "node:fs";
import type { BrowserContext, Locator, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DEMO_ACCOUNTS } from "../../app/accounts.ts";
import { downstreamKey } from "../../src/core/index.ts";
import { type RunningService, startService } from "../app/service.ts";
import { CHROMIUM, haveChromium, type OpenBrowser, openChromium } from "../helpers/chromium.ts";
import { backends } from "../helpers/db.ts";

if (!haveChromium)
  console.warn(`playground browser test skipped: no Chromium at ${CHROMIUM} (apt-get install chromium)`);
const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;
const ACCOUNT = DEMO_ACCOUNTS[0].id;
const SCREENSHOTS = process.env.UPDATE_SCREENSHOTS === "1" ? "docs/images" : "test-results";
/** The screenshots go in the repository: a few hundred KB at most each. */
const MAX_PNG_BYTES = 400_000;

/** What the page says about the current key (its live views). */
interface Shown {
  point: string;
  charges: number;
  payments: number;
  outbox: number;
}

describe.skipIf(!haveChromium)("the playground page in Chromium", () => {
  let svc: RunningService;
  let browser: OpenBrowser;
  let context: BrowserContext;
  let page: Page;
  /** Every answer the page got from the service that was a 404 (its icon included). */
  const notFound: string[] = [];

  beforeAll(async () => {
    svc = await startService(backend, { paymentsMode: "phases", playground: true });
    browser = await openChromium();
    ({ context, page } = browser);
    page.on("response", (res) => {
      if (res.status() === 404) notFound.push(res.url());
    });
    await page.goto(`${svc.url}/`);
  });
  afterAll(async () => {
    await browser?.close();
    await svc?.stop();
  });

  // ---- the page --------------------------------------------------------------------------------------

  const text = async (l: Locator) => (await l.textContent()) ?? "";
  const currentKey = () => text(page.getByTestId("current-key"));
  const attempt = (n: number) => page.locator(`[data-testid="attempt"][data-n="${n}"]`);
  let attempts = 0;

  /** Click, then wait for attempt `n` (the next one) to end; returns what the list shows for it. */
  async function finished(n: number) {
    const li = attempt(n);
    await li.and(page.locator(':not([data-kind="pending"])')).waitFor({ timeout: 15_000 });
    const next = li.getByTestId("next");
    return {
      status: await li.getAttribute("data-status"),
      replayed: (await li.getAttribute("data-replayed")) === "true",
      text: await text(li),
      /** The next step the page offers, and the operation state it read from the answer. */
      next: await next.getAttribute("data-next"),
      state: await next.getAttribute("data-state"),
      nextText: await text(next),
    };
  }
  async function click(testId: string) {
    await page.getByTestId(testId).click();
    return ++attempts;
  }
  async function setFault(testId: string | null) {
    for (const id of ["fault-lose-reply", "fault-crash", "fault-slow", "fault-wrong-body"]) {
      await page.getByTestId(id).setChecked(id === testId);
    }
  }
  async function shown(): Promise<Shown> {
    return {
      point: await text(page.getByTestId("key-point")),
      charges: Number(await page.getByTestId("charges-count").getAttribute("data-count")),
      payments: Number(await page.getByTestId("payments").getAttribute("data-count")),
      outbox: Number(await page.getByTestId("outbox-count").getAttribute("data-count")),
    };
  }

  // ---- the truth ---------------------------------------------------------------------------------------

  async function truth(key: string): Promise<Shown & { status: number | null; lease: boolean }> {
    const { rows } = await svc.open.db.query<{
      recovery_point: string;
      status: number | null;
      lease: boolean;
      claim_id: string | null;
    }>(
      `SELECT recovery_point, status, lease_token IS NOT NULL AS lease, claim_id::text AS claim_id
         FROM idem.keys WHERE scope = $1 AND key = $2 AND NOT marker`,
      [ACCOUNT, key],
    );
    expect(rows.length).toBeLessThanOrEqual(1);
    const res = await fetch(`${svc.providerUrl}/v1/charges`);
    // The provider knows the payment by its claim (`downstreamKey`), not by the client's key.
    const downstream = rows[0] ? downstreamKey(ACCOUNT, key, rows[0].claim_id) : undefined;
    const charges = (
      (await res.json()) as { data: Array<{ id: string; idempotency_key: string }> }
    ).data.filter((c) => c.idempotency_key === downstream);
    const ids = charges.map((c) => `pay_${c.id.replace(/^ch_/, "")}`);
    const payments = await svc.count(
      "SELECT count(*)::int AS n FROM payments WHERE account_id = $1 AND id = ANY($2::text[])",
      [ACCOUNT, ids],
    );
    const outbox = await svc.count(
      "SELECT count(*)::int AS n FROM idem.outbox WHERE topic = 'receipt-email' AND payload->>'payment' = ANY($1::text[])",
      [ids],
    );
    return {
      point: rows[0]?.recovery_point ?? "none",
      status: rows[0]?.status === null || rows[0] === undefined ? null : Number(rows[0].status),
      lease: rows[0]?.lease ?? false,
      charges: charges.length,
      payments,
      outbox,
    };
  }

  /** Wait until the page's live views show `want`, then check that the database says the same. */
  async function agrees(key: string, want: Shown) {
    await expect.poll(shown, { timeout: 10_000, interval: 100 }).toEqual(want);
    const db = await truth(key);
    expect({ point: db.point, charges: db.charges, payments: db.payments, outbox: db.outbox }).toEqual(want);
    return db;
  }

  const PAID = { point: "done", charges: 1, payments: 1, outbox: 1 };

  it("loads with its switches and live views", async () => {
    await expect.poll(() => text(page.getByTestId("emails"))).toMatch(/No email worker/);
    expect(await page.title()).toMatch(/idem playground/);
    expect(await page.getByTestId("retry").isDisabled()).toBe(true);
    expect(await text(page.getByTestId("charges-count"))).toBe("0 charges for the account");
  });

  it("has an icon: no 404 while the page loads", async () => {
    const href = await page.locator('link[rel="icon"]').getAttribute("href");
    expect(href).toBe("/playground/favicon.svg");
    for (const path of [href, "/favicon.ico"]) {
      const res = await context.request.get(`${svc.url}${path}`);
      expect([path, res.status(), res.headers()["content-type"]]).toEqual([path, 200, "image/svg+xml"]);
      expect((await res.text()).startsWith("<svg")).toBe(true);
    }
    expect(notFound).toEqual([]);
  });

  it("wears the console's look: both stylesheets load and apply", async () => {
    const sheets = await page
      .locator('link[rel="stylesheet"]')
      .evaluateAll((links) => links.map((l) => l.getAttribute("href")));
    expect(sheets).toEqual(["/playground/look.css", "/playground/playground.css"]);
    // --line comes from the shared look.css; .faults is styled by playground.css alone.
    const line = await page.evaluate(() =>
      getComputedStyle(document.documentElement).getPropertyValue("--line").trim(),
    );
    expect(line).toBe("#e3e6ec");
    expect(notFound).toEqual([]);
  });

  it("lose the reply, then retry: one charge, and the retry is a replay", async () => {
    await setFault("fault-lose-reply");
    const n = await click("pay");
    const lost = await finished(n);
    expect(lost.status).toBe("none");
    expect(lost.text).toMatch(/no answer/);
    expect(lost.text).toMatch(/reply lost/);
    const key = await currentKey();
    // The server did the work although the client saw nothing.
    const db = await agrees(key, PAID);
    expect(db.status).toBe(201);
    // One charge, said in the singular.
    expect(await text(page.getByTestId("charges-count"))).toMatch(
      /^1 charge for this key \(1 for the account\)$/,
    );
    expect(await text(page.getByTestId("outbox-count"))).toBe("1 receipt-email event for this key's payment");

    await setFault(null);
    const retry = await finished(await click("retry"));
    expect(retry.status).toBe("201");
    expect(retry.replayed).toBe(true);
    expect(retry.text).toMatch(/Idempotent-Replayed: true/);
    expect(retry.next).toBe("done");
    await agrees(key, PAID);
  });

  it("crash after the provider charged, then retry: 409 while the lease holds, then one charge, done", async () => {
    await setFault("fault-crash");
    const crashed = await finished(await click("pay"));
    expect(crashed.status).toBe("none");
    expect(crashed.text).toMatch(/server crashed/);
    // Retry at once: the dead worker's lease (3 s in the playground) still holds the key.
    const early = await finished(await click("retry"));
    expect(early.status).toBe("409");
    expect(early.text).toMatch(/Retry-After/);
    // In flight: the page reads operation_state in_progress and says to wait, then retry the same key.
    expect(early.state).toBe("in_progress");
    expect(early.next).toBe("wait");
    expect(early.nextText).toMatch(/operation_state: in_progress/);
    expect(early.nextText).toMatch(/Wait \d+ s \(Retry-After\), then retry with the same key/);
    expect(crashed.next).toBe("retry");
    const key = await currentKey();
    // Charged at the provider, but the key is still at `started` with the dead worker's lease.
    const db = await agrees(key, { point: "started", charges: 1, payments: 0, outbox: 0 });
    expect(db.lease).toBe(true);
    await setFault(null);

    // The page shows the lease running out; then the retry takes the key over and finishes it.
    await expect.poll(() => text(page.getByTestId("key-lease")), { timeout: 10_000 }).toMatch(/expired/);
    const retry = await finished(await click("retry"));
    expect(retry.status).toBe("201");
    expect(retry.replayed).toBe(false);
    const after = await agrees(key, PAID);
    expect(after.lease).toBe(false);
    expect(await text(page.getByTestId("key-status"))).toBe("201");
  });

  it("wrong body on the reused key: 422 shown, nothing changes", async () => {
    const key = await currentKey();
    await setFault("fault-wrong-body");
    const wrong = await finished(await click("pay"));
    expect(wrong.status).toBe("422");
    expect(wrong.text).toMatch(/Same key, different body/);
    expect([wrong.state, wrong.next]).toEqual(["none", "new-key"]);
    expect(await currentKey()).toBe(key);
    await agrees(key, PAID);
  });

  it("a declined card: 402, failed_not_applied, and the page says a new key is safe", async () => {
    await setFault(null);
    await page.getByTestId("card").selectOption("4000000000000002");
    try {
      const declined = await finished(await click("pay"));
      expect(declined.status).toBe("402");
      expect(declined.state).toBe("failed_not_applied");
      expect(declined.next).toBe("new-key");
      expect(declined.nextText).toMatch(/operation_state: failed_not_applied/);
      expect(declined.nextText).toMatch(/A new key is safe: nothing was charged/);
      // What the page says is true: the key saved the decline, and no payment was made.
      const db = await truth(await currentKey());
      expect(db.status).toBe(402);
      expect(db.payments).toBe(0);
      // The retry replays the decline, and still offers a new key.
      const again = await finished(await click("retry"));
      expect([again.status, again.replayed, again.next]).toEqual(["402", true, "new-key"]);
    } finally {
      await page.getByTestId("card").selectOption("4242424242424242");
    }
  });

  it("double-tap: two requests with one key, one charge", async () => {
    await setFault(null);
    await page.getByTestId("double-tap").click();
    const a = ++attempts;
    const b = ++attempts;
    const [first, second] = [await finished(a), await finished(b)];
    const statuses = [first.status, second.status].sort();
    // One of them made the payment; the other saw it in flight (409) or replayed it.
    expect([
      ["201", "201"],
      ["201", "409"],
    ]).toContainEqual(statuses);
    if (statuses[1] === "201") expect([first.replayed, second.replayed].sort()).toEqual([false, true]);
    await agrees(await currentKey(), PAID);
  });

  it("a slow worker whose lease expires: the page prompts a retry, which takes over; the slow one is fenced off", async () => {
    const prompt = page.getByTestId("prompt");
    expect(await prompt.isHidden()).toBe(true);
    await setFault("fault-slow");
    const slow = await click("pay");
    const key = await currentKey();
    // While it stalls, the page says to press Retry, and marks the button.
    await prompt.waitFor({ state: "visible", timeout: 5_000 });
    expect(await text(prompt)).toMatch(
      new RegExp(`Attempt #${slow} is stalled .*Press Retry \\(same key\\) while it stalls`),
    );
    expect(await page.getByTestId("retry").getAttribute("class")).toMatch(/nudge/);
    // The charge is recorded; the worker stalls before the local phase and its lease runs out.
    await expect.poll(() => text(page.getByTestId("key-point")), { timeout: 10_000 }).toBe("charged");
    await expect.poll(() => text(page.getByTestId("key-lease")), { timeout: 10_000 }).toMatch(/expired/);
    await expect.poll(() => prompt.getAttribute("data-lease"), { timeout: 5_000 }).toBe("expired");
    expect(await text(prompt)).toMatch(/its lease has expired: press Retry \(same key\) now/);
    expect((await truth(key)).point).toBe("charged");
    expect((await attempt(slow).getAttribute("data-kind")) === "pending").toBe(true);

    await setFault(null);
    const retry = await finished(await click("retry"));
    expect(retry.status).toBe("201");
    await agrees(key, PAID);

    const late = await finished(slow);
    expect(late.status).toBe("409");
    expect(late.text).toMatch(/too slow/);
    // The stall is over: no more prompt.
    expect(await prompt.isHidden()).toBe(true);
    expect(await page.getByTestId("retry").getAttribute("class")).not.toMatch(/nudge/);
    await agrees(key, PAID);
    // And a retry now replays the payment the takeover made.
    const replay = await finished(await click("retry"));
    expect([replay.status, replay.replayed]).toEqual(["201", true]);
  });

  it("fits a 390 px phone screen, and leaves screenshots at desktop and phone sizes", async () => {
    mkdirSync(SCREENSHOTS, { recursive: true });
    const desktop = `${SCREENSHOTS}/playground-desktop.png`;
    await page.setViewportSize({ width: 1280, height: 900 });
    await page.screenshot({ path: desktop });

    // A phone's width, with the page full of long keys and tables from the scenarios above.
    await page.setViewportSize({ width: 390, height: 844 });
    const widths = await page.evaluate(() => ({
      document: document.documentElement.scrollWidth,
      body: document.body.scrollWidth,
      viewport: window.innerWidth,
    }));
    expect(widths.viewport).toBe(390);
    expect(widths.document).toBeLessThanOrEqual(390);
    expect(widths.body).toBeLessThanOrEqual(390);
    const phone = `${SCREENSHOTS}/playground-phone.png`;
    await page.screenshot({ path: phone });

    for (const png of [desktop, phone]) {
      expect(statSync(png).size).toBeGreaterThan(10_000);
      expect(statSync(png).size).toBeLessThan(MAX_PNG_BYTES);
    }
    expect(await text(page.locator("body"))).not.toMatch(
      /\b1 (charges|payments|emails|receipt-email events)\b/,
    );
  });
});
