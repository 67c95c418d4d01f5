/**
 * Checked by `tsc` (npm test's typecheck), never run: `c.var.idempotency` is typed on the routes that use
 * idem's Hono middleware and only there, and the `scope` callback gets the route's own context type.
 */
import type { Hono } from "hono";
import { idempotency } from "../../src/http/hono.ts";
import type { AppParts } from "./contract.ts";

export function typingOfTheMiddleware(app: Hono, parts: AppParts): void {
  type Authed = { Variables: { accountId: string } };
  const keyed = idempotency<Authed>({ store: parts.store, scope: (c) => c.var.accountId.toLowerCase() });
  app.post("/typed", keyed, (c) => c.text(`${c.var.idempotency.key} ${c.var.idempotencyOutcome}`));
  // @ts-expect-error: no idempotency middleware on this route, so no c.var.idempotency
  app.post("/untyped", (c) => c.text(String(c.var.idempotency.key)));
  // @ts-expect-error: the scope callback's context is typed: accountId is a string, not a number
  idempotency<Authed>({ store: parts.store, scope: (c) => c.var.accountId.toFixed() });
}
