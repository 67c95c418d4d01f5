import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PATTERN_TABLES } from "../../app/patterns.ts";
import { backends } from "../helpers/db.ts";
import { KEY_1, KEY_2, pay, type RunningService, startService } from "./service.ts";

const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;

describe(`idempotent by design: each endpoint's repeat behaviour on ${backend.name}`, () => {
  let svc: RunningService;
  beforeAll(async () => {
    svc = await startService(backend);
  });
  afterAll(async () => {
    await svc?.stop();
  });

  const call = (
    method: string,
    path: string,
    body?: unknown,
    headers: Record<string, string> = {},
    apiKey = KEY_1,
  ) =>
    fetch(`${svc.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json", ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
    });

  it("wallet top-ups with a caller-chosen id: a repeated top-up adds nothing", async () => {
    const wallet = `w_${randomUUID().slice(0, 8)}`;
    const first = await call("POST", `/v1/wallets/${wallet}/topups`, {
      id: `${wallet}-t1`,
      amount_cents: 5000,
    });
    const again = await call("POST", `/v1/wallets/${wallet}/topups`, {
      id: `${wallet}-t1`,
      amount_cents: 5000,
    });
    const second = await call("POST", `/v1/wallets/${wallet}/topups`, {
      id: `${wallet}-t2`,
      amount_cents: 300,
    });
    expect([first.status, again.status, second.status]).toEqual([201, 200, 201]);
    expect((await again.json()).applied).toBe(false);
    const reused = await call("POST", `/v1/wallets/${wallet}/topups`, {
      id: `${wallet}-t1`,
      amount_cents: 9999,
    });
    expect(reused.status).toBe(409);
    const w = await (await call("GET", `/v1/wallets/${wallet}`)).json();
    expect(w.balance_cents).toBe(5300);
  });

  it("top-up ids are per account: another account neither learns of an id nor takes it", async () => {
    const wallet = `w_${randomUUID().slice(0, 8)}`;
    const id = `${wallet}-shared`;
    const mine = await call("POST", `/v1/wallets/${wallet}/topups`, { id, amount_cents: 700 });
    expect(mine.status).toBe(201);
    // Account 2 picks the same id (same wallet name, another amount): its own top-up, not a 409.
    const theirs = await call("POST", `/v1/wallets/${wallet}/topups`, { id, amount_cents: 50 }, {}, KEY_2);
    expect(theirs.status).toBe(201);
    expect(await theirs.json()).toMatchObject({ id, applied: true, balance_cents: 50 });
    // Each account's retry is still recognised as its own repeat; balances stay apart.
    const mineAgain = await call("POST", `/v1/wallets/${wallet}/topups`, { id, amount_cents: 700 });
    expect(mineAgain.status).toBe(200);
    const reuse = await call("POST", `/v1/wallets/${wallet}/topups`, { id, amount_cents: 1 }, {}, KEY_2);
    expect(reuse.status).toBe(409);
    expect((await (await call("GET", `/v1/wallets/${wallet}`)).json()).balance_cents).toBe(700);
    expect(
      (await (await call("GET", `/v1/wallets/${wallet}`, undefined, {}, KEY_2)).json()).balance_cents,
    ).toBe(50);
  });

  it("a database made before (top-up id alone as primary key) is converted by the same DDL", async () => {
    const schema = `old_${randomUUID().slice(0, 8)}`;
    const conflicts = await svc.open.db.transaction(async (tx) => {
      await tx.exec(`CREATE SCHEMA ${schema}; SET LOCAL search_path = ${schema};
        CREATE TABLE wallet_topups (id text PRIMARY KEY, account_id text NOT NULL, wallet_id text NOT NULL,
          amount_cents bigint NOT NULL CHECK (amount_cents > 0), created_at timestamptz NOT NULL DEFAULT now());
        INSERT INTO wallet_topups (id, account_id, wallet_id, amount_cents) VALUES ('t1', 'acct_1', 'w', 5);`);
      await tx.exec(PATTERN_TABLES);
      await tx.exec(PATTERN_TABLES); // twice: a restart
      const insert = (account: string) =>
        tx.query(
          `INSERT INTO wallet_topups (id, account_id, wallet_id, amount_cents) VALUES ('t1', $1, 'w', 5)
           ON CONFLICT (account_id, id) DO NOTHING`,
          [account],
        );
      const counts = [(await insert("acct_2")).rowCount, (await insert("acct_1")).rowCount];
      await tx.exec(`SET LOCAL search_path = public; DROP SCHEMA ${schema} CASCADE`);
      return counts;
    });
    expect(conflicts).toEqual([1, 0]);
  });

  it("answers bad bodies and ids with a 400 naming the field and its rule, before any write", async () => {
    const cases: Array<[string, string, unknown, string]> = [
      [
        "POST",
        "/v1/wallets/w1/topups",
        { id: "has space", amount_cents: 5 },
        "Invalid top-up: id must be 1 to 64 letters, digits, _ or - (the top-up's id: chosen by you, unique in your account, reused on retries).",
      ],
      [
        "POST",
        "/v1/wallets/w1/topups",
        { id: "t1" },
        "Invalid top-up: amount_cents must be a whole number from 1 to 100000000.",
      ],
      [
        "POST",
        "/v1/wallets/w%20x/topups",
        { id: "t1", amount_cents: 5 },
        "The wallet id must be 1 to 64 letters, digits, _ or -.",
      ],
      [
        "PUT",
        "/v1/products/p1",
        { price_cents: 0 },
        "Invalid product: price_cents must be a whole number from 1 to 100000000.",
      ],
      [
        "PUT",
        "/v1/carts/c1/items/i1",
        { qty: 1001 },
        "Invalid cart item: qty must be a whole number from 0 to 1000 (the quantity you want, not a change).",
      ],
      [
        "POST",
        "/v1/orders",
        { amount_cents: -1 },
        "Invalid amount: amount_cents must be a whole number from 1 to 100000000.",
      ],
    ];
    for (const [method, path, body, detail] of cases) {
      const r = await call(method, path, body, { "idempotency-key": randomUUID() });
      expect(r.status, `${method} ${path}`).toBe(400);
      expect(await r.json()).toMatchObject({ type: "urn:idem:problem:invalid-body", detail });
    }
    const form = await fetch(`${svc.url}/v1/products/p1`, {
      method: "PUT",
      headers: { authorization: `Bearer ${KEY_2}`, "content-type": "application/x-www-form-urlencoded" },
      body: "price_cents=5",
    });
    expect(form.status).toBe(415);
  });

  it("order shipping is a conditional write: the second ship changes nothing", async () => {
    const order = await (
      await call("POST", "/v1/orders", { amount_cents: 1200 }, { "idempotency-key": randomUUID() })
    ).json();
    const ship1 = await (await call("POST", `/v1/orders/${order.id}/ship`)).json();
    const ship2 = await (await call("POST", `/v1/orders/${order.id}/ship`)).json();
    expect(ship1).toEqual({ id: order.id, status: "shipped", changed: true });
    expect(ship2).toEqual({ id: order.id, status: "shipped", changed: false });
    expect((await call("POST", `/v1/orders/${order.id}/ship`, undefined, {}, KEY_2)).status).toBe(404);
  });

  it("orders require a key, and a retried order creates one order", async () => {
    expect((await call("POST", "/v1/orders", { amount_cents: 100 })).status).toBe(400);
    const key = randomUUID();
    const a = await call("POST", "/v1/orders", { amount_cents: 100 }, { "idempotency-key": key });
    const b = await call("POST", "/v1/orders", { amount_cents: 100 }, { "idempotency-key": key });
    expect(b.headers.get("idempotent-replayed")).toBe("true");
    expect(await b.text()).toBe(await a.text());
  });

  it("product prices use ETag and If-Match: a stale version gets 412 and changes nothing", async () => {
    const id = `p_${randomUUID().slice(0, 8)}`;
    const created = await call("PUT", `/v1/products/${id}`, { price_cents: 1000 });
    expect(created.status).toBe(201);
    const etag = created.headers.get("etag")!;
    expect(etag).toBe('"v1"');
    const noMatch = await call("PUT", `/v1/products/${id}`, { price_cents: 1100 });
    expect(noMatch.status).toBe(428);
    const updated = await call("PUT", `/v1/products/${id}`, { price_cents: 1500 }, { "if-match": etag });
    expect(updated.status).toBe(200);
    expect(updated.headers.get("etag")).toBe('"v2"');
    const repeated = await call("PUT", `/v1/products/${id}`, { price_cents: 1500 }, { "if-match": etag });
    expect(repeated.status).toBe(412);
    expect(repeated.headers.get("etag")).toBe('"v2"');
    const stale = await call("PUT", `/v1/products/${id}`, { price_cents: 1200 }, { "if-match": etag });
    expect(stale.status).toBe(412);
    expect(await stale.json()).toMatchObject({ title: "Precondition Failed", status: 412 });
    const now = await call("GET", `/v1/products/${id}`);
    expect(now.headers.get("etag")).toBe('"v2"');
    expect((await now.json()).price_cents).toBe(1500);
  });

  it("cart quantities are PUT as the result: repeating the PUT leaves qty at 3", async () => {
    const cart = `c_${randomUUID().slice(0, 8)}`;
    for (let i = 0; i < 3; i++) {
      expect((await call("PUT", `/v1/carts/${cart}/items/sku-7`, { qty: 3 })).status).toBe(200);
    }
    const c = await (await call("GET", `/v1/carts/${cart}`)).json();
    expect(c.items).toEqual([{ item_id: "sku-7", qty: 3 }]);
  });

  it("refunds require a key, replay on retry, and never exceed the payment", async () => {
    const payment = await (
      await pay(svc.url, { key: randomUUID(), body: '{"amount_cents":1000,"currency":"eur"}' })
    ).json();
    const path = `/v1/payments/${payment.id}/refunds`;
    expect((await call("POST", path, { amount_cents: 400 })).status).toBe(400);
    const key = randomUUID();
    const r1 = await call("POST", path, { amount_cents: 400 }, { "idempotency-key": key });
    const r1again = await call("POST", path, { amount_cents: 400 }, { "idempotency-key": key });
    expect(r1.status).toBe(201);
    expect(await r1again.text()).toBe(await r1.text());
    const tooMuch = await call("POST", path, { amount_cents: 700 }, { "idempotency-key": randomUUID() });
    expect(tooMuch.status).toBe(422);
    const rest = await call("POST", path, { amount_cents: 600 }, { "idempotency-key": randomUUID() });
    expect((await rest.json()).remaining_cents).toBe(0);
    expect(
      await svc.count("SELECT count(*)::int AS n FROM refunds WHERE payment_id = $1", [payment.id]),
    ).toBe(2);
  });
});
