/** Cart quantities: PUT the result ("quantity is 3"), not the change. */
import { Hono } from "hono";
import { CartItemRequest } from "../schemas.ts";
import { validBody, validIds } from "../validate.ts";
import type { PatternDeps, PatternEnv } from "./shared.ts";

export const CART_TABLES = `
  CREATE TABLE IF NOT EXISTS cart_items (
    account_id text NOT NULL,
    cart_id    text NOT NULL,
    item_id    text NOT NULL,
    qty        integer NOT NULL CHECK (qty >= 0),
    PRIMARY KEY (account_id, cart_id, item_id)
  );
`;

export function cartRoutes(deps: PatternDeps): Hono<PatternEnv> {
  const { db, limit, auth } = deps;
  const app = new Hono<PatternEnv>();
  const cartItem = validBody(CartItemRequest, { what: "cart item" });
  app.put("/v1/carts/:cart/items/:item", limit, auth, validIds("cart", "item"), cartItem, async (c) => {
    const { cart, item } = c.req.param();
    const qty = c.var.body.qty;
    await db.query(
      `INSERT INTO cart_items (account_id, cart_id, item_id, qty) VALUES ($1, $2, $3, $4)
       ON CONFLICT (account_id, cart_id, item_id) DO UPDATE SET qty = EXCLUDED.qty`,
      [c.var.accountId, cart, item, qty],
    );
    return c.json({ cart_id: cart, item_id: item, qty });
  });

  app.get("/v1/carts/:cart", auth, async (c) => {
    const { rows } = await db.query<{ item_id: string; qty: number }>(
      "SELECT item_id, qty FROM cart_items WHERE account_id = $1 AND cart_id = $2 AND qty > 0 ORDER BY item_id",
      [c.var.accountId, c.req.param("cart")],
    );
    return c.json({
      id: c.req.param("cart"),
      items: rows.map((r) => ({ item_id: r.item_id, qty: Number(r.qty) })),
    });
  });
  return app;
}
