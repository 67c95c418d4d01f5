/**
 * The spec's other ways to make a write safe to repeat, each with the tool that fits it:
 *
 * - wallet top-ups: the caller picks the top-up's id (unique per account); `INSERT ... ON CONFLICT
 *   (account_id, id) DO NOTHING`, and the balance is the sum of top-ups, so a repeat adds nothing (no key);
 * - order shipping: a conditional write, `UPDATE ... WHERE status = 'paid'`, a one-way step;
 * - product prices: versions with `ETag` / `If-Match` (optimistic locking; 412 on a stale version);
 * - cart quantities: PUT the result ("quantity is 3"), not the change;
 * - orders and refunds: new things, so an `Idempotency-Key` is required (atomic mode).
 */
import { randomBytes } from "node:crypto";
import { Hono, type MiddlewareHandler } from "hono";
import { bodyLimit } from "hono/body-limit";
import { type AtomicStore, FAILED_NOT_APPLIED } from "idem";
import { idempotency } from "idem/hono";
import type { Db, Tx } from "idem/postgres";
import type { ApiKeys } from "./accounts.ts";
import { authenticate, MAX_BODY_BYTES, replayAuthorized } from "./payments.ts";
import { problem } from "./problems.ts";
import { AmountRequest, CartItemRequest, ProductRequest, TopUpRequest } from "./schemas.ts";
import { validBody, validIds } from "./validate.ts";

type Env = { Variables: { accountId: string } };

export const PATTERN_TABLES = `
  CREATE TABLE IF NOT EXISTS wallet_topups (
    id           text NOT NULL,                  -- chosen by the caller: a retry carries the same id
    account_id   text NOT NULL,
    wallet_id    text NOT NULL,
    amount_cents bigint NOT NULL CHECK (amount_cents > 0),
    created_at   timestamptz NOT NULL DEFAULT now()
  );
  -- Top-up ids are per account: one account can neither see nor take another's. Databases made before
  -- had the id alone as primary key: dropped here (no lock taken, nothing done, once it is gone).
  CREATE UNIQUE INDEX IF NOT EXISTS wallet_topups_account_id ON wallet_topups (account_id, id);
  DO $$ BEGIN
    IF EXISTS (SELECT 1 FROM pg_constraint
                WHERE conrelid = 'wallet_topups'::regclass AND conname = 'wallet_topups_pkey') THEN
      ALTER TABLE wallet_topups DROP CONSTRAINT wallet_topups_pkey;
    END IF;
  END $$;
  CREATE INDEX IF NOT EXISTS wallet_topups_wallet ON wallet_topups (account_id, wallet_id);
  CREATE TABLE IF NOT EXISTS orders (
    id           text PRIMARY KEY,
    account_id   text NOT NULL,
    amount_cents bigint NOT NULL,
    status       text NOT NULL,                  -- paid -> shipped
    shipped_at   timestamptz
  );
  CREATE TABLE IF NOT EXISTS products (
    id          text NOT NULL,
    account_id  text NOT NULL,
    price_cents bigint NOT NULL,
    version     integer NOT NULL,
    PRIMARY KEY (account_id, id)
  );
  CREATE TABLE IF NOT EXISTS cart_items (
    account_id text NOT NULL,
    cart_id    text NOT NULL,
    item_id    text NOT NULL,
    qty        integer NOT NULL CHECK (qty >= 0),
    PRIMARY KEY (account_id, cart_id, item_id)
  );
  CREATE TABLE IF NOT EXISTS refunds (
    id           text PRIMARY KEY,
    account_id   text NOT NULL,
    payment_id   text NOT NULL,
    amount_cents bigint NOT NULL CHECK (amount_cents > 0),
    created_at   timestamptz NOT NULL DEFAULT now()
  );
  CREATE INDEX IF NOT EXISTS refunds_payment ON refunds (payment_id);
`;

const etagOf = (version: number) => `"v${version}"`;

export function patternRoutes(deps: { db: Db; store: AtomicStore<Tx>; apiKeys: ApiKeys }): Hono<Env> {
  const app = new Hono<Env>();
  const limit = bodyLimit({
    maxSize: MAX_BODY_BYTES,
    onError: () => problem(413, "body-too-large", `The body is larger than ${MAX_BODY_BYTES} bytes.`),
  });
  const auth = authenticate(deps.apiKeys) as unknown as MiddlewareHandler<Env>;
  const keyed = idempotency<Env>({
    store: deps.store,
    scope: (c) => c.var.accountId,
    authorizeReplay: replayAuthorized(deps.apiKeys),
  });
  // One schema per body (app/schemas.ts), checked before any key is claimed or row written.
  const topUp = validBody(TopUpRequest, { what: "top-up" });
  const amountBody = validBody(AmountRequest, { what: "amount" });
  const product = validBody(ProductRequest, { what: "product" });
  const cartItem = validBody(CartItemRequest, { what: "cart item" });

  // --- Wallet top-ups: a caller-chosen id and ON CONFLICT DO NOTHING ---
  app.post("/v1/wallets/:wallet/topups", limit, auth, validIds("wallet"), topUp, async (c) => {
    const wallet = c.req.param("wallet");
    const { id, amount_cents: amount } = c.var.body;
    const inserted = await deps.db.query(
      `INSERT INTO wallet_topups (id, account_id, wallet_id, amount_cents) VALUES ($1, $2, $3, $4)
       ON CONFLICT (account_id, id) DO NOTHING RETURNING id`,
      [id, c.var.accountId, wallet, amount],
    );
    if (inserted.rowCount === 0) {
      const { rows } = await deps.db.query<{ wallet_id: string; amount_cents: string }>(
        "SELECT wallet_id, amount_cents FROM wallet_topups WHERE account_id = $1 AND id = $2",
        [c.var.accountId, id],
      );
      const r = rows[0];
      if (!r || r.wallet_id !== wallet || Number(r.amount_cents) !== amount) {
        return problem(
          409,
          "topup-id-taken",
          "This top-up id was already used for another top-up; choose a new id.",
          [],
          FAILED_NOT_APPLIED,
        );
      }
    }
    const balance = await walletBalance(deps.db, c.var.accountId, wallet);
    return c.json(
      {
        id,
        wallet_id: wallet,
        amount_cents: amount,
        applied: inserted.rowCount === 1,
        balance_cents: balance,
      },
      inserted.rowCount === 1 ? 201 : 200,
    );
  });

  app.get("/v1/wallets/:wallet", auth, async (c) => {
    const wallet = c.req.param("wallet");
    return c.json({ id: wallet, balance_cents: await walletBalance(deps.db, c.var.accountId, wallet) });
  });

  // --- Orders: created with a key; shipped with a conditional write ---
  app.post("/v1/orders", limit, auth, amountBody, keyed, async (c) => {
    const amount = c.var.body.amount_cents;
    const id = `ord_${randomBytes(10).toString("hex")}`;
    await c.var.idempotency.tx.query(
      "INSERT INTO orders (id, account_id, amount_cents, status) VALUES ($1, $2, $3, 'paid')",
      [id, c.var.accountId, amount],
    );
    return c.json({ id, amount_cents: amount, status: "paid" }, 201, { location: `/v1/orders/${id}` });
  });

  app.post("/v1/orders/:id/ship", auth, async (c) => {
    const id = c.req.param("id");
    // One-way step: only a paid order becomes shipped. A repeat finds the condition false: UPDATE 0.
    const shipped = await deps.db.query(
      "UPDATE orders SET status = 'shipped', shipped_at = now() WHERE id = $1 AND account_id = $2 AND status = 'paid'",
      [id, c.var.accountId],
    );
    const { rows } = await deps.db.query<{ status: string }>(
      "SELECT status FROM orders WHERE id = $1 AND account_id = $2",
      [id, c.var.accountId],
    );
    if (!rows[0]) return problem(404, "not-found", "No order with this id in your account.");
    if (rows[0].status !== "shipped")
      return problem(409, "order-not-shippable", `The order is ${rows[0].status}.`, [], FAILED_NOT_APPLIED);
    return c.json({ id, status: "shipped", changed: shipped.rowCount === 1 });
  });

  app.get("/v1/orders/:id", auth, async (c) => {
    const { rows } = await deps.db.query(
      "SELECT id, amount_cents, status FROM orders WHERE id = $1 AND account_id = $2",
      [c.req.param("id"), c.var.accountId],
    );
    if (!rows[0]) return problem(404, "not-found", "No order with this id in your account.");
    return c.json({ ...rows[0], amount_cents: Number(rows[0].amount_cents) });
  });

  // --- Product prices: versions, ETag and If-Match ---
  app.get("/v1/products/:id", auth, async (c) => {
    const { rows } = await deps.db.query<{ price_cents: string; version: number }>(
      "SELECT price_cents, version FROM products WHERE id = $1 AND account_id = $2",
      [c.req.param("id"), c.var.accountId],
    );
    if (!rows[0]) return problem(404, "not-found", "No product with this id in your account.");
    const v = Number(rows[0].version);
    return c.json({ id: c.req.param("id"), price_cents: Number(rows[0].price_cents), version: v }, 200, {
      etag: etagOf(v),
    });
  });

  app.put("/v1/products/:id", limit, auth, validIds("id"), product, async (c) => {
    const id = c.req.param("id");
    const price = c.var.body.price_cents;
    const ifMatch = c.req.header("if-match");
    if (!ifMatch) {
      // Creating a product needs no version; changing one does.
      const created = await deps.db.query(
        "INSERT INTO products (id, account_id, price_cents, version) VALUES ($1, $2, $3, 1) ON CONFLICT DO NOTHING",
        [id, c.var.accountId, price],
      );
      if (created.rowCount === 1)
        return c.json({ id, price_cents: price, version: 1 }, 201, { etag: etagOf(1) });
      return problem(
        428,
        "precondition-required",
        "Send If-Match with the product's current ETag to change its price.",
      );
    }
    const m = /^"v(\d{1,9})"$/.exec(ifMatch.trim());
    if (!m)
      return problem(400, "invalid-if-match", 'If-Match must be an ETag this API gave you, such as "v3".');
    const expected = Number(m[1]);
    // Optimistic locking: the write carries the version it was based on. A repeat (or a stale writer)
    // finds the version moved on and changes nothing.
    const { rows } = await deps.db.query<{ version: number }>(
      `UPDATE products SET price_cents = $3, version = version + 1
        WHERE id = $1 AND account_id = $2 AND version = $4 RETURNING version`,
      [id, c.var.accountId, price, expected],
    );
    if (!rows[0]) {
      const cur = await deps.db.query<{ version: number }>(
        "SELECT version FROM products WHERE id = $1 AND account_id = $2",
        [id, c.var.accountId],
      );
      if (!cur.rows[0]) return problem(404, "not-found", "No product with this id in your account.");
      return problem(
        412,
        "precondition-failed",
        "The product changed since you read it: GET it again and retry.",
        [["etag", etagOf(Number(cur.rows[0].version))]],
        FAILED_NOT_APPLIED,
      );
    }
    const v = Number(rows[0].version);
    return c.json({ id, price_cents: price, version: v }, 200, { etag: etagOf(v) });
  });

  // --- Cart quantities: say the result, not the change ---
  app.put("/v1/carts/:cart/items/:item", limit, auth, validIds("cart", "item"), cartItem, async (c) => {
    const { cart, item } = c.req.param();
    const qty = c.var.body.qty;
    await deps.db.query(
      `INSERT INTO cart_items (account_id, cart_id, item_id, qty) VALUES ($1, $2, $3, $4)
       ON CONFLICT (account_id, cart_id, item_id) DO UPDATE SET qty = EXCLUDED.qty`,
      [c.var.accountId, cart, item, qty],
    );
    return c.json({ cart_id: cart, item_id: item, qty });
  });

  app.get("/v1/carts/:cart", auth, async (c) => {
    const { rows } = await deps.db.query<{ item_id: string; qty: number }>(
      "SELECT item_id, qty FROM cart_items WHERE account_id = $1 AND cart_id = $2 AND qty > 0 ORDER BY item_id",
      [c.var.accountId, c.req.param("cart")],
    );
    return c.json({
      id: c.req.param("cart"),
      items: rows.map((r) => ({ item_id: r.item_id, qty: Number(r.qty) })),
    });
  });

  // --- Refunds: a new thing, so keyed; never more than what was paid ---
  app.post("/v1/payments/:id/refunds", limit, auth, amountBody, keyed, async (c) => {
    const tx = c.var.idempotency.tx;
    const paymentId = c.req.param("id");
    const amount = c.var.body.amount_cents;
    // Lock the payment so two different refunds of it cannot both pass the check.
    const { rows } = await tx.query<{ amount_cents: string }>(
      "SELECT amount_cents FROM payments WHERE id = $1 AND account_id = $2 FOR UPDATE",
      [paymentId, c.var.accountId],
    );
    if (!rows[0]) return problem(404, "not-found", "No payment with this id in your account.");
    const refunded = await tx.query<{ total: string }>(
      "SELECT coalesce(sum(amount_cents), 0) AS total FROM refunds WHERE payment_id = $1",
      [paymentId],
    );
    const left = Number(rows[0].amount_cents) - Number(refunded.rows[0]!.total);
    if (amount > left) {
      return problem(
        422,
        "refund-too-large",
        `Only ${left} cents of this payment are left to refund.`,
        [],
        FAILED_NOT_APPLIED,
      );
    }
    const id = `re_${randomBytes(10).toString("hex")}`;
    await tx.query("INSERT INTO refunds (id, account_id, payment_id, amount_cents) VALUES ($1, $2, $3, $4)", [
      id,
      c.var.accountId,
      paymentId,
      amount,
    ]);
    return c.json({ id, payment_id: paymentId, amount_cents: amount, remaining_cents: left - amount }, 201);
  });

  return app;
}

async function walletBalance(db: Db, account: string, wallet: string): Promise<number> {
  const { rows } = await db.query<{ total: string }>(
    "SELECT coalesce(sum(amount_cents), 0) AS total FROM wallet_topups WHERE account_id = $1 AND wallet_id = $2",
    [account, wallet],
  );
  return Number(rows[0]!.total);
}
