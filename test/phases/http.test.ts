/**
 * The reference service's payments in phases mode, driven over HTTP (Hono's fetch interface) with the
 * provider simulator over real HTTP: status codes, headers and counts as a client sees them.
 */
import { Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ApiKeys, DEMO_ACCOUNTS, ensureDemoAccounts } from "../../app/accounts.ts";
import { prepareSchema } from "../../app/database.ts";
import { paymentPhasesRoutes } from "../../app/payments-phases.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { crashAt, pauseAt } from "../../src/testing/faults.ts";
import { type Provider, startProvider } from "../../src/testing/provider.ts";
import { backends, type OpenDb } from "../helpers/db.ts";
import { TestTime } from "../helpers/time.ts";

const API_KEY = DEMO_ACCOUNTS[0].apiKey;
const ACCOUNT = DEMO_ACCOUNTS[0].id;

describe.each(backends)("payments in phases mode over HTTP on $name", (backend) => {
  let open: OpenDb;
  let provider: Provider;
  let store: PostgresStore;
  let apiKeys: ApiKeys;
  const now = new TestTime(Date.UTC(2030, 6, 1, 12));

  const appWith = (faults?: Parameters<typeof paymentPhasesRoutes>[0]["faults"]) => {
    const app = new Hono();
    app.route("/", paymentPhasesRoutes({ db: open.db, store, apiKeys, providerUrl: provider.url, faults }));
    app.onError((_err, c) => c.text("the server crashed", 500)); // a simulated crash: a plain 500
    return app;
  };
  const post = (app: Hono, key: string, body: unknown) =>
    app.request("/v1/payments", {
      method: "POST",
      headers: {
        authorization: `Bearer ${API_KEY}`,
        "content-type": "application/json",
        "idempotency-key": `"${key}"`,
      },
      body: JSON.stringify(body),
    });
  const receipts = async () =>
    (
      await open.db.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM idem.outbox WHERE topic = 'receipt-email'",
      )
    ).rows[0]!.n;

  beforeAll(async () => {
    open = await backend.open();
    await prepareSchema(open.db);
    await ensureDemoAccounts(open.db);
    store = await PostgresStore.open(open.db, { timeShift: now });
    apiKeys = new ApiKeys(open.db);
    provider = await startProvider({ seed: 5, declineCards: ["4000000000000002"] });
  });
  afterAll(async () => {
    await provider?.close();
    await open?.close();
  });

  it("charges once, answers 201, and replays byte for byte with Idempotent-Replayed", async () => {
    const app = appWith();
    const first = await post(app, "http-1", { amount_cents: 1234, currency: "eur" });
    expect(first.status).toBe(201);
    expect(first.headers.get("location")).toMatch(/^\/v1\/payments\/pay_/);
    expect(first.headers.get("idempotency-expires")).toBeTruthy();
    const body = await first.text();
    const again = await post(app, "http-1", { currency: "eur", amount_cents: 1234 });
    expect(again.status).toBe(201);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(await again.text()).toBe(body);
    const claimId = (await store.inspect(ACCOUNT, "http-1"))!.claimId;
    const charged = provider.charges().filter((c) => c.idempotency_key === `${ACCOUNT}:${claimId}`);
    expect(charged).toHaveLength(1);
    const id = JSON.parse(body).id;
    const got = await app.request(`/v1/payments/${id}`, { headers: { authorization: `Bearer ${API_KEY}` } });
    expect((await got.json()).amount_cents).toBe(1234);
  });

  it("a declined card is a saved 402, replayed; no payment, no receipt", async () => {
    const app = appWith();
    const before = await receipts();
    const body = { amount_cents: 500, currency: "eur", card: "4000000000000002" };
    const first = await post(app, "http-decline", body);
    expect(first.status).toBe(402);
    expect(first.headers.get("content-type")).toBe("application/problem+json");
    const second = await post(app, "http-decline", body);
    expect(second.status).toBe(402);
    expect(second.headers.get("idempotent-replayed")).toBe("true");
    expect(await receipts()).toBe(before);
  });

  it("a provider timeout or 5xx answers 503 with Retry-After, and the retry goes through at once", async () => {
    const app = appWith();
    provider.failNext("503");
    const first = await post(app, "http-503", { amount_cents: 700, currency: "eur" });
    expect(first.status).toBe(503);
    expect(first.headers.get("retry-after")).toBe("1");
    const retry = await post(app, "http-503", { amount_cents: 700, currency: "eur" });
    expect(retry.status).toBe(201);
  });

  it("another body under the same key is 422; a duplicate while the first works is 409 with Retry-After", async () => {
    const stall = pauseAt("before-phase", { phase: "charged", key: "http-dup" });
    const first = post(appWith(stall), "http-dup", { amount_cents: 900, currency: "eur" });
    await stall.reached;
    const dup = await post(appWith(), "http-dup", { amount_cents: 900, currency: "eur" });
    expect(dup.status).toBe(409);
    expect(Number(dup.headers.get("retry-after"))).toBeGreaterThan(0);
    const wrong = await post(appWith(), "http-dup", { amount_cents: 901, currency: "eur" });
    expect(wrong.status).toBe(422);
    stall.release();
    expect((await first).status).toBe(201);
  });

  it("a crash answers 500 and the retry after the lease finishes with one charge and one receipt", async () => {
    const before = await receipts();
    const crashed = await post(appWith(crashAt("after-external")), "http-crash", {
      amount_cents: 800,
      currency: "eur",
    });
    expect(crashed.status).toBe(500);
    now.ms += 31_000;
    const retry = await post(appWith(), "http-crash", { amount_cents: 800, currency: "eur" });
    expect(retry.status).toBe(201);
    expect(await receipts()).toBe(before + 1);
    const claimId = (await store.inspect(ACCOUNT, "http-crash"))!.claimId;
    expect(provider.charges().filter((c) => c.idempotency_key === `${ACCOUNT}:${claimId}`)).toHaveLength(1);
  });

  it("validates before claiming: a bad body is 400 and the key stays unused", async () => {
    const app = appWith();
    expect((await post(app, "http-bad", { amount_cents: -1, currency: "eur" })).status).toBe(400);
    expect((await post(app, "http-bad", { amount_cents: 100, currency: "eur" })).status).toBe(201);
  });

  it("a provider without idempotency keys: a timeout after it charged is found by reference, one charge", async () => {
    const plain = await startProvider({ seed: 6, idempotency: false });
    try {
      const app = new Hono();
      app.route(
        "/",
        paymentPhasesRoutes({
          db: open.db,
          store,
          apiKeys,
          providerUrl: plain.url,
          providerIdempotency: false,
          providerTimeoutMs: 300,
        }),
      );
      plain.failNext("late");
      const first = await post(app, "http-no-dedup", { amount_cents: 777, currency: "eur" });
      expect(first.status).toBe(201);
      const again = await post(app, "http-no-dedup", { amount_cents: 777, currency: "eur" });
      expect(again.headers.get("idempotent-replayed")).toBe("true");
      const claimId = (await store.inspect(ACCOUNT, "http-no-dedup"))!.claimId;
      expect(plain.charges().filter((c) => c.reference === `${ACCOUNT}:${claimId}`)).toHaveLength(1);
    } finally {
      await plain.close();
    }
  });
});
