/**
 * The spec's other ways to make a write safe to repeat, each with the tool that fits it:
 *
 * - wallet top-ups: the caller picks the top-up's id (unique per account); `INSERT ... ON CONFLICT
 *   (account_id, id) DO NOTHING`, and the balance is the sum of top-ups, so a repeat adds nothing (no key);
 * - order shipping: a conditional write, `UPDATE ... WHERE status = 'paid'`, a one-way step;
 * - product prices: versions with `ETag` / `If-Match` (optimistic locking; 412 on a stale version);
 * - cart quantities: PUT the result ("quantity is 3"), not the change;
 * - orders and refunds: new things, so an `Idempotency-Key` is required (atomic mode);
 * - checkouts: a new thing whose saga (app/checkout/) reserves, charges and ships through outbox and inbox.
 */
import { Hono, type MiddlewareHandler } from "hono";
import { bodyLimit } from "hono/body-limit";
import type { AtomicStore } from "idem";
import { idempotency } from "idem/hono";
import type { Db, Tx } from "idem/postgres";
import type { ApiKeys } from "./accounts.ts";
import { checkoutRoutes } from "./checkout/routes.ts";
import { CHECKOUT_TABLES } from "./checkout/tables.ts";
import { CART_TABLES, cartRoutes } from "./patterns/carts.ts";
import { ORDER_TABLES, orderRoutes } from "./patterns/orders.ts";
import { PRODUCT_TABLES, productRoutes } from "./patterns/products.ts";
import { REFUND_TABLES, refundRoutes } from "./patterns/refunds.ts";
import type { PatternDeps, PatternEnv } from "./patterns/shared.ts";
import { WALLET_TABLES, walletRoutes } from "./patterns/wallets.ts";
import { authenticate, MAX_BODY_BYTES, replayAuthorized } from "./payments.ts";
import { problem } from "./problems.ts";

/** The tables of every pattern (made by app/database.ts's `prepareSchema`). */
export const PATTERN_TABLES = [
  WALLET_TABLES,
  ORDER_TABLES,
  PRODUCT_TABLES,
  CART_TABLES,
  REFUND_TABLES,
  CHECKOUT_TABLES,
].join("");

/** Every pattern's routes, one file each under app/patterns/, with the middlewares they share. */
export function patternRoutes(deps: { db: Db; store: AtomicStore<Tx>; apiKeys: ApiKeys }): Hono<PatternEnv> {
  const shared: PatternDeps = {
    db: deps.db,
    limit: bodyLimit({
      maxSize: MAX_BODY_BYTES,
      onError: () => problem(413, "body-too-large", `The body is larger than ${MAX_BODY_BYTES} bytes.`),
    }),
    auth: authenticate(deps.apiKeys) as unknown as MiddlewareHandler<PatternEnv>,
    keyed: idempotency<PatternEnv>({
      store: deps.store,
      scope: (c) => c.var.accountId,
      authorizeReplay: replayAuthorized(deps.apiKeys),
      traceContext: "link", // public routes: a trace of their own, linked to the caller's
    }),
  };
  const app = new Hono<PatternEnv>();
  for (const routes of [walletRoutes, orderRoutes, productRoutes, cartRoutes, refundRoutes, checkoutRoutes]) {
    app.route("/", routes(shared));
  }
  return app;
}
