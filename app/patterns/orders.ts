/** Orders: created with a key (a new thing); shipped with a conditional write, a one-way step. */
import { randomBytes } from "node:crypto";
import { Hono } from "hono";
import { FAILED_NOT_APPLIED } from "idem";
import { problem } from "../problems.ts";
import { AmountRequest } from "../schemas.ts";
import { validBody } from "../validate.ts";
import type { PatternDeps, PatternEnv } from "./shared.ts";

export const ORDER_TABLES = `
  CREATE TABLE IF NOT EXISTS orders (
    id           text PRIMARY KEY,
    account_id   text NOT NULL,
    amount_cents bigint NOT NULL,
    status       text NOT NULL,                  -- paid -> shipped
    shipped_at   timestamptz
  );
`;

export function orderRoutes(deps: PatternDeps): Hono<PatternEnv> {
  const { db, limit, auth, keyed } = deps;
  const app = new Hono<PatternEnv>();
  const amountBody = validBody(AmountRequest, { what: "amount" });
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
    const shipped = await db.query(
      "UPDATE orders SET status = 'shipped', shipped_at = now() WHERE id = $1 AND account_id = $2 AND status = 'paid'",
      [id, c.var.accountId],
    );
    const { rows } = await db.query<{ status: string }>(
      "SELECT status FROM orders WHERE id = $1 AND account_id = $2",
      [id, c.var.accountId],
    );
    if (!rows[0]) return problem(404, "not-found", "No order with this id in your account.");
    if (rows[0].status !== "shipped")
      return problem(409, "order-not-shippable", `The order is ${rows[0].status}.`, [], FAILED_NOT_APPLIED);
    return c.json({ id, status: "shipped", changed: shipped.rowCount === 1 });
  });

  app.get("/v1/orders/:id", auth, async (c) => {
    const { rows } = await db.query(
      "SELECT id, amount_cents, status FROM orders WHERE id = $1 AND account_id = $2",
      [c.req.param("id"), c.var.accountId],
    );
    if (!rows[0]) return problem(404, "not-found", "No order with this id in your account.");
    return c.json({ ...rows[0], amount_cents: Number(rows[0].amount_cents) });
  });
  return app;
}
