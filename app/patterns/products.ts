/** Product prices: versions with `ETag` / `If-Match` (optimistic locking; 412 on a stale version). */
import { Hono } from "hono";
import { FAILED_NOT_APPLIED } from "idem";
import { problem } from "../problems.ts";
import { ProductRequest } from "../schemas.ts";
import { validBody, validIds } from "../validate.ts";
import type { PatternDeps, PatternEnv } from "./shared.ts";

const etagOf = (version: number) => `"v${version}"`;

export const PRODUCT_TABLES = `
  CREATE TABLE IF NOT EXISTS products (
    id          text NOT NULL,
    account_id  text NOT NULL,
    price_cents bigint NOT NULL,
    version     integer NOT NULL,
    PRIMARY KEY (account_id, id)
  );
`;

export function productRoutes(deps: PatternDeps): Hono<PatternEnv> {
  const { db, limit, auth } = deps;
  const app = new Hono<PatternEnv>();
  const product = validBody(ProductRequest, { what: "product" });
  app.get("/v1/products/:id", auth, async (c) => {
    const { rows } = await db.query<{ price_cents: string; version: number }>(
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
      const created = await db.query(
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
    const { rows } = await db.query<{ version: number }>(
      `UPDATE products SET price_cents = $3, version = version + 1
        WHERE id = $1 AND account_id = $2 AND version = $4 RETURNING version`,
      [id, c.var.accountId, price, expected],
    );
    if (!rows[0]) {
      const cur = await db.query<{ version: number }>(
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
  return app;
}
