/**
 * The operations console (/admin), end to end: the reference service with an admin token, Debian's
 * Chromium driven by playwright-core. A person signs in, opens the key waiting for review from the
 * queue, reads its timeline, settles it; pastes a customer's operation_ref and reads that payment's
 * story; requeues a parked outbox event; runs the audit. After each, the database must say the same:
 * the key's state, the settlement, the outbox row, and one recorded action with the person's name.
 * Then the page at a phone's width must not scroll sideways. Screenshots go to test-results/, or with
 * UPDATE_SCREENSHOTS=1 to docs/images/ (the README's).
 */
import { existsSync, mkdirSync, mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type BrowserContext, chromium, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ApiKeys, DEMO_ACCOUNTS } from "../../app/accounts.ts";
import { createApp } from "../../app/app.ts";
import { createLogger } from "../../app/observability.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { type RunningService, startService } from "../app/service.ts";
import { backends } from "../helpers/db.ts";
import { claimOf, paymentsRunner } from "../phases/helpers.ts";

const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
const haveChromium = existsSync(CHROMIUM);
if (!haveChromium && process.env.CI) {
  throw new Error(`CI=true but there is no Chromium at ${CHROMIUM}: apt-get install chromium`);
}
if (!haveChromium) console.warn(`console browser test skipped: no Chromium at ${CHROMIUM}`);
const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;
const ACCOUNT = DEMO_ACCOUNTS[0];
const TOKEN = "token-of-alice-0123456789";
const SCREENSHOTS = process.env.UPDATE_SCREENSHOTS === "1" ? "docs/images" : "test-results";
const MAX_PNG_BYTES = 400_000;
const PAY = { amount_cents: 4_200, currency: "eur" };

describe.skipIf(!haveChromium)("the operations console in Chromium", () => {
  let svc: RunningService;
  let context: BrowserContext;
  let page: Page;
  let profile: string;
  let parkedId: string;
  const paidKey = "a3f1c9e2-5b7d-4e8a-9c1f-2d6b8e4a7c10";

  beforeAll(async () => {
    svc = await startService(backend, {
      paymentsMode: "phases",
      providerIdempotency: false,
      adminTokens: `alice:${TOKEN},bob:Hq7vX2mR9pL4sK8wZ3nT6yB1`,
    });
    // A payment made through the service, as a customer would.
    const paid = await fetch(`${svc.url}/v1/payments`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${ACCOUNT.apiKey}`,
        "content-type": "application/json",
        "idempotency-key": paidKey,
      },
      body: JSON.stringify({ amount_cents: 2_500, currency: "eur" }),
    });
    expect(paid.status).toBe(201);
    // A charge at a provider without idempotency keys whose answer never came: only a person can tell.
    svc.provider!.failNext("late");
    await expect(
      paymentsRunner(svc.store, svc.providerUrl!, { noIdempotency: "none", timeoutMs: 300 }).run(
        claimOf(ACCOUNT.id, "order-7731", PAY),
        PAY,
      ),
    ).rejects.toMatchObject({ code: "operation-uncertain" });
    // A receipt event the relay gave up on.
    parkedId = await svc.open.db.transaction((tx) =>
      writeOutbox(tx, {
        topic: "receipt-email",
        type: "payment.succeeded",
        aggregateId: "pay_1",
        payload: { to: "customer@example.com" },
      }),
    );
    await svc.open.db.query(
      "UPDATE idem.outbox SET parked_at = now(), attempts = 10, last_error = 'smtp: 554 rejected' WHERE id = $1",
      [parkedId],
    );

    profile = mkdtempSync(join(tmpdir(), "idem-chromium-"));
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
      ],
      viewport: { width: 1280, height: 900 },
    });
    page = context.pages()[0] ?? (await context.newPage());
    await page.goto(`${svc.url}/admin`);
  });
  afterAll(async () => {
    await context?.close();
    await svc?.stop();
    if (profile) rmSync(profile, { recursive: true, force: true });
  });

  /** What people did (failed sign-ins, recorded too, are nobody's: actor "-"). */
  const actions = async () =>
    (
      await svc.open.db.query<{ actor: string; action: string; key: string | null }>(
        "SELECT actor, action, key FROM idem.admin_actions WHERE actor <> '-' ORDER BY id",
      )
    ).rows;

  it("is off without IDEM_ADMIN_TOKEN, saying how to turn it on", async () => {
    const off = createApp({
      db: svc.open.db,
      store: svc.store,
      apiKeys: new ApiKeys(svc.open.db),
      paymentsMode: "atomic",
      logger: createLogger({ level: "silent" }),
    });
    for (const path of ["/admin", "/admin/api/keys?state=unfinished"]) {
      const res = await off.fetch(new Request(`http://x${path}`));
      expect(res.status).toBe(404);
      expect(((await res.json()) as { detail: string }).detail).toContain("IDEM_ADMIN_TOKEN");
    }
  });

  it("refuses a wrong token, then signs in with the right one", async () => {
    await page.getByTestId("token").fill("not-the-token-at-all");
    await page.getByTestId("sign-in").click();
    await expect.poll(() => page.getByTestId("message").textContent()).toContain("refused");
    await page.getByTestId("token").fill(TOKEN);
    await page.getByTestId("sign-in").click();
    await expect.poll(() => page.getByTestId("who").textContent()).toBe("signed in as alice");
    // The failed sign-in is on the record, with where it came from.
    const { rows } = await svc.open.db.query<{ action: string; target: string }>(
      "SELECT action, target FROM idem.admin_actions WHERE actor = '-'",
    );
    expect(rows).toEqual([{ action: "admin.auth-failed", target: "127.0.0.1" }]);
  });

  it("opens the key waiting for review from the queue, shows its timeline, and settles it", async () => {
    const row = page.locator('[data-testid="review"][data-key="order-7731"]');
    await row.getByRole("button", { name: "Open" }).click();
    await expect.poll(() => page.getByTestId("state").textContent()).toBe("needs_review");
    const kinds = await page
      .getByTestId("event")
      .evaluateAll((els) => els.map((e) => e.getAttribute("data-kind")));
    expect(kinds).toEqual(expect.arrayContaining(["claimed", "call-begun", "review-opened", "expires"]));
    await page.getByTestId("answer-status").fill("402");
    await page.getByTestId("answer-body").fill('{"error":"declined at the provider"}');
    await page.getByTestId("settle-note").fill("provider dashboard: charge ch_9 declined");
    mkdirSync(SCREENSHOTS, { recursive: true });
    await page.screenshot({ path: `${SCREENSHOTS}/admin-console.png` });
    await page.getByTestId("settle").click();
    await expect.poll(() => page.getByTestId("state").textContent()).toBe("done");

    const { rows } = await svc.open.db.query<{ settled_by: string; status: number }>(
      `SELECT r.settled_by, k.status FROM idem.reviews r JOIN idem.keys k
          ON k.scope = r.scope AND k.key = r.key AND NOT k.marker WHERE r.key = 'order-7731'`,
    );
    expect(rows).toEqual([{ settled_by: "alice", status: 402 }]);
    expect(await actions()).toEqual([{ actor: "alice", action: "key.settle", key: "order-7731" }]);
    await expect.poll(() => page.getByTestId("action").first().textContent()).toContain("key.settle");
    await expect.poll(() => page.getByTestId("reviews").textContent()).toContain("nobody is waiting");
  });

  it("finds a payment by the operation_ref a customer pastes", async () => {
    await page.getByTestId("ref").fill(svc.store.refs.encode(ACCOUNT.id, paidKey));
    await page.getByTestId("find").click();
    await expect.poll(() => page.getByTestId("story").textContent()).toContain(paidKey);
    expect(await page.getByTestId("state").textContent()).toBe("done");
    const saved = page.locator('[data-testid="event"][data-kind="answer-saved"]');
    expect(await saved.textContent()).toContain("201");
    await page.getByTestId("ref").fill(svc.store.refs.encode(ACCOUNT.id, "no-such-key"));
    await page.getByTestId("find").click();
    await expect.poll(() => page.getByTestId("not-found").count()).toBe(1);
  });

  it("says why a paid key cannot be forgotten, and forgets it only for a person who reversed it", async () => {
    await page.getByTestId("ref").fill(svc.store.refs.encode(ACCOUNT.id, paidKey));
    await page.getByTestId("find").click();
    await expect.poll(() => page.getByTestId("forget-verdict").textContent()).toMatch(/cannot be forgotten/);
    const verdict = await page.getByTestId("forget-verdict").textContent();
    expect(verdict).toContain("saved answer (201) says the operation took effect");
    const button = page.getByTestId("forget");
    expect(await button.isDisabled()).toBe(true);
    await page
      .getByTestId("forget-reason")
      .fill("refunded at the provider (re_123); the customer pays again");
    await page.getByTestId("effect-reversed").check();
    expect(await button.isDisabled()).toBe(false);
    await button.click();
    await expect.poll(() => page.getByTestId("not-found").count()).toBe(1);
    expect(await svc.open.db.query("SELECT 1 FROM idem.keys WHERE key = $1", [paidKey])).toMatchObject({
      rows: [],
    });
    expect((await actions()).at(-1)).toEqual({
      actor: "alice",
      action: "key.forget.effect-reversed",
      key: paidKey,
    });
  });

  it("requeues a parked outbox event and runs the audit, both recorded", async () => {
    const row = page.locator(`[data-testid="parked-event"][data-id="${parkedId}"]`);
    expect(await row.textContent()).toContain("smtp: 554 rejected");
    await row.getByRole("button", { name: "Requeue", exact: true }).click();
    await expect.poll(() => row.count()).toBe(0);
    const { rows } = await svc.open.db.query(
      "SELECT 1 FROM idem.outbox WHERE id = $1 AND parked_at IS NULL",
      [parkedId],
    );
    expect(rows).toHaveLength(1);

    await page.getByTestId("run-audit").click();
    await expect.poll(() => page.getByTestId("audit-when").textContent()).toContain("by alice");
    expect(await page.getByTestId("audit").locator("li").count()).toBe(3);
    expect((await actions()).map((a) => a.action)).toEqual([
      "key.settle",
      "key.forget.effect-reversed",
      "outbox.requeue",
      "audit.run",
    ]);
  });

  it("fits a 390 px phone screen, and leaves screenshots at desktop and phone sizes", async () => {
    await page.getByTestId("ref").fill(svc.store.refs.encode(ACCOUNT.id, "order-7731"));
    await page.getByTestId("find").click();
    await expect.poll(() => page.getByTestId("state").textContent()).toBe("done");
    const story = `${SCREENSHOTS}/admin-console-settled.png`;
    await page.screenshot({ path: story });
    await page.setViewportSize({ width: 390, height: 844 });
    const widths = await page.evaluate(() => ({
      document: document.documentElement.scrollWidth,
      viewport: window.innerWidth,
    }));
    expect(widths.viewport).toBe(390);
    expect(widths.document).toBeLessThanOrEqual(390);
    const phone = `${SCREENSHOTS}/admin-console-phone.png`;
    await page.screenshot({ path: phone });
    for (const png of [`${SCREENSHOTS}/admin-console.png`, story, phone]) {
      expect(statSync(png).size).toBeGreaterThan(10_000);
      expect(statSync(png).size).toBeLessThan(MAX_PNG_BYTES);
    }
  });
});
