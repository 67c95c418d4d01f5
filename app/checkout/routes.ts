/**
 * `POST /v1/checkouts` starts the saga (steps.ts): in ONE transaction, with the key's claim (atomic
 * mode), the checkout row and its first event, `checkout.placed`; the answer is 202 with the checkout,
 * which the saga then moves on. `GET /v1/checkouts/{id}` shows where it is, with every step taken.
 */
import { randomBytes } from "node:crypto";
import { Hono } from "hono";
import type { PatternDeps, PatternEnv } from "../patterns/shared.ts";
import { problem } from "../problems.ts";
import { CheckoutRequest } from "../schemas.ts";
import { validBody } from "../validate.ts";
import { emit } from "./steps.ts";

export function checkoutRoutes(deps: PatternDeps): Hono<PatternEnv> {
  const { db, limit, auth, keyed } = deps;
  const app = new Hono<PatternEnv>();
  app.post(
    "/v1/checkouts",
    limit,
    auth,
    validBody(CheckoutRequest, { what: "checkout" }),
    keyed,
    async (c) => {
      const body = c.var.body;
      const { tx, scope, key } = c.var.idempotency;
      const id = `co_${randomBytes(10).toString("hex")}`;
      await tx.query(
        `INSERT INTO checkouts (id, account_id, idem_key, sku, quantity, amount_cents, currency, card, country, status)
       VALUES ($1, $2, $3, $4, $5, $6, 'eur', $7, $8, 'placed')`,
        [id, scope, key, body.sku, body.quantity, body.amount_cents, body.card ?? null, body.country],
      );
      await emit(
        tx,
        "checkout.placed",
        { checkout: id, account: scope, key },
        traceHeaders(c.req.raw.headers),
      );
      return c.json({ id, status: "placed" }, 202, { location: `/v1/checkouts/${id}` });
    },
  );

  app.get("/v1/checkouts/:id", auth, async (c) => {
    const { rows } = await db.query<Record<string, unknown>>(
      `SELECT id, sku, quantity, amount_cents, country, status, charge_id, refund_id, shipment_id
         FROM checkouts WHERE id = $1 AND account_id = $2`,
      [c.req.param("id"), c.var.accountId],
    );
    const checkout = rows[0];
    if (!checkout) return problem(404, "not-found", "No checkout with this id in your account.");
    const steps = await db.query<{ step: string; at: Date }>(
      "SELECT step, at FROM checkout_steps WHERE checkout_id = $1 ORDER BY at",
      [checkout.id],
    );
    return c.json({
      ...checkout,
      amount_cents: Number(checkout.amount_cents),
      steps: steps.rows.map((s) => ({ step: s.step, at: new Date(s.at).toISOString() })),
    });
  });
  return app;
}

/** The caller's trace context, when it sent one and no span of ours is active (writeOutbox adds ours). */
function traceHeaders(headers: Headers): Record<string, string> {
  const out: Record<string, string> = {};
  for (const h of ["traceparent", "tracestate"]) {
    const v = headers.get(h);
    if (v) out[h] = v;
  }
  return out;
}
