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

/** On a keyed route `key` and `scope` are strings; with `required: false` they may be undefined. */
export function typingOfKeysAndBodies(app: Hono, parts: AppParts): void {
  const scope = (c: { req: { header(name: string): string | undefined } }) => c.req.header("x-account");
  app.post("/keyed", idempotency({ store: parts.store, scope }), (c) => {
    const { key, scope: account }: { key: string; scope: string } = c.var.idempotency;
    return c.text(`${key.length} ${account.length}`);
  });
  app.post("/optional", idempotency({ store: parts.store, scope, required: false }), (c) => {
    // @ts-expect-error: a route with required: false may run without a key
    const key: string = c.var.idempotency.key;
    return c.text(String(key));
  });
  type Payment = { amount_cents: number };
  app.post("/typed-body", idempotency<any, Payment>({ store: parts.store, scope }), (c) =>
    c.text(String(c.var.idempotency.body.amount_cents.toFixed())),
  );
}
