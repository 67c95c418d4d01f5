/** Refunds: a new thing, so an `Idempotency-Key` is required (atomic mode); never more than was paid. */
import { randomBytes } from "node:crypto";
import { Hono } from "hono";
import { FAILED_NOT_APPLIED } from "idem";
import { problem } from "../problems.ts";
import { AmountRequest } from "../schemas.ts";
import { validBody } from "../validate.ts";
import type { PatternDeps, PatternEnv } from "./shared.ts";

export const REFUND_TABLES = `
  CREATE TABLE IF NOT EXISTS refunds (
    id           text PRIMARY KEY,
    account_id   text NOT NULL,
    payment_id   text NOT NULL,
    amount_cents bigint NOT NULL CHECK (amount_cents > 0),
    created_at   timestamptz NOT NULL DEFAULT now()
  );
  CREATE INDEX IF NOT EXISTS refunds_payment ON refunds (payment_id);
`;

export function refundRoutes(deps: PatternDeps): Hono<PatternEnv> {
  const { limit, auth, keyed } = deps;
  const app = new Hono<PatternEnv>();
  const amountBody = validBody(AmountRequest, { what: "amount" });
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
