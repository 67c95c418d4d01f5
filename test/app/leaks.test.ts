/**
 * Issue 13 item 7 on the reference service: no card number in clear where the completer's input is kept,
 * each account sees only its own charges, and the playground shows neither raw internal errors nor
 * another account's data (top-up ids per account: test/app/patterns.test.ts).
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ApiKeys } from "../../app/accounts.ts";
import { createApp } from "../../app/app.ts";
import { createLogger } from "../../app/observability.ts";
import { backends } from "../helpers/db.ts";
import { KEY_2, pay, type RunningService, startService } from "./service.ts";

const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;
const CARD = "4242424242424242";

describe(`what the service keeps and shows, on ${backend.name}`, () => {
  let svc: RunningService;
  beforeAll(async () => {
    svc = await startService(backend, { paymentsMode: "phases", playground: true });
  });
  afterAll(async () => {
    await svc?.stop();
  });

  const playgroundPay = (body: unknown) =>
    fetch(`${svc.url}/playground/api/pay`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: typeof body === "string" ? body : JSON.stringify(body),
    });

  it("stores and sends a token, never the card number, and still charges once", async () => {
    const key = randomUUID();
    const body = JSON.stringify({ amount_cents: 2100, currency: "eur", card: CARD });
    const first = await pay(svc.url, { key, body });
    expect(first.status).toBe(201);
    const again = await pay(svc.url, { key, body });
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    const { rows } = await svc.open.db.query<{ request: string }>(
      "SELECT request::text AS request FROM idem.keys WHERE key = $1 AND NOT marker",
      [key],
    );
    expect(rows).toHaveLength(1);
    expect(rows[0]!.request).not.toContain(CARD);
    expect(rows[0]!.request).not.toContain(CARD.slice(0, 12));
    expect(JSON.parse(rows[0]!.request).card).toMatch(/^tok_[0-9a-f]{24}$/);
    const charges = (await (await fetch(`${svc.providerUrl}/v1/charges`)).json()).data as any[];
    const claimId = (await svc.store.inspect("acct_demo_1", key))!.claimId;
    const mine = charges.filter((c) => c.idempotency_key === `acct_demo_1:${claimId}`);
    expect(mine).toHaveLength(1);
    expect(mine[0].card).toBe(JSON.parse(rows[0]!.request).card);
    // The declined test card is public: it still reaches the provider as it is, and is declined.
    const declined = await pay(svc.url, {
      key: randomUUID(),
      body: JSON.stringify({ amount_cents: 100, currency: "eur", card: "4000000000000002" }),
    });
    expect(declined.status).toBe(402);
  });

  it("the simulator lists one scope's charges when asked for that scope", async () => {
    const k1 = randomUUID();
    const k2 = randomUUID();
    expect((await pay(svc.url, { key: k1 })).status).toBe(201);
    expect((await pay(svc.url, { key: k2, apiKey: KEY_2 })).status).toBe(201);
    const list = async (scope: string) =>
      ((await (await fetch(`${svc.providerUrl}/v1/charges?scope=${scope}`)).json()).data as any[]).map(
        (c) => c.idempotency_key as string,
      );
    const one = await list("acct_demo_1");
    const two = await list("acct_demo_2");
    const claim = async (scope: string, key: string) => (await svc.store.inspect(scope, key))!.claimId;
    expect(one).toContain(`acct_demo_1:${await claim("acct_demo_1", k1)}`);
    expect(one.every((k) => k.startsWith("acct_demo_1:"))).toBe(true);
    expect(two).toEqual(expect.arrayContaining([`acct_demo_2:${await claim("acct_demo_2", k2)}`]));
    expect(two.every((k) => k.startsWith("acct_demo_2:"))).toBe(true);
  });

  it("the playground takes any key the service takes (the core's rule), and limits its body", async () => {
    const long = `"${"k".repeat(250)}\\"q`; // 255 characters, with a quote and a backslash
    const ok = await playgroundPay({ key: long, amount_cents: 300 });
    expect(ok.status).toBe(200);
    expect(await ok.json()).toMatchObject({ key: long, answered: true, status: 201 });
    const tooLong = await playgroundPay({ key: "k".repeat(256), amount_cents: 300 });
    expect(tooLong.status).toBe(400);
    expect((await tooLong.json()).detail).toMatch(/^Invalid attempt: key must be 1 to 255 visible ASCII/);
    const spaced = await playgroundPay({ key: "two words", amount_cents: 300 });
    expect(spaced.status).toBe(400);
    const big = await playgroundPay({ key: "big", amount_cents: 1, pad: "x".repeat(200_000) });
    expect(big.status).toBe(413);
  });

  it("the playground's state reads the key through the store and shows only the demo account", async () => {
    const key = randomUUID();
    const r = await playgroundPay({ key, amount_cents: 450 });
    expect((await r.json()).status).toBe(201);
    // The same key used by the other account: not the playground's business.
    expect((await pay(svc.url, { key: `"${key}"`, apiKey: KEY_2 })).status).toBe(201);
    const state = await (await fetch(`${svc.url}/playground/api/state?key=${key}`)).json();
    expect(state.row).toMatchObject({ recovery_point: "done", state: "done", status: 201 });
    expect(state.row.operation_ref).toMatch(/^op_/);
    expect(state.row).not.toHaveProperty("marker");
    expect(state.charges.forKey).toHaveLength(1);
    const claimId = (await svc.store.inspect("acct_demo_1", key))!.claimId;
    expect(state.charges.forKey[0].idempotency_key).toBe(`acct_demo_1:${claimId}`);
    for (const ch of state.charges.recent) expect(ch.idempotency_key).toMatch(/^acct_demo_1:/);
    expect(state.payments).toHaveLength(1);
  });

  it("the playground answers a provider failure with a generic message, never the raw error", async () => {
    const logged: string[] = [];
    const app = createApp({
      db: svc.open.db,
      store: svc.store,
      apiKeys: new ApiKeys(svc.open.db),
      paymentsMode: "phases",
      providerUrl: "http://127.0.0.1:9", // nothing listens (discard port)
      playground: true,
      logger: createLogger({ level: "error", destination: { write: (line: string) => logged.push(line) } }),
    });
    const key = randomUUID();
    const state = await app.request(`/playground/api/state?key=${key}`);
    expect(state.status).toBe(200);
    const text = await state.text();
    expect(JSON.parse(text).charges).toEqual({ error: "the payment provider did not answer" });
    expect(text).not.toMatch(/ECONNREFUSED|127\.0\.0\.1|fetch failed/);
    // ... while the log has the real error, for the operator.
    expect(logged.join("\n")).toMatch(/the payment provider did not answer/);
    const attempt = await app.request("/playground/api/pay", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ key, amount_cents: 100, fault: "crash-after-charge" }),
    });
    expect(await attempt.text()).not.toMatch(/ECONNREFUSED|127\.0\.0\.1:9/);
  });
});
