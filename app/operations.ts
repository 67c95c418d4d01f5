/**
 * `GET /v1/operations/{operation_ref}`: what became of an operation, by the reference every keyed answer
 * carries (`Idempotency-Operation-Ref`), for the account that owns it. idem's lookup handler
 * (`operationLookup` from idem/web) mounted behind the service's authentication, with the keyed routes'
 * replay check. `?wait=SECONDS` holds the request while the operation is in progress, at most
 * `MAX_WAIT_SECONDS`.
 */
import { type Context, Hono, type MiddlewareHandler } from "hono";
import { operationReader, type PostgresStore } from "idem/postgres";
import { operationLookup } from "idem/web";
import type { ApiKeys } from "./accounts.ts";
import { authenticate, replayAuthorized } from "./payments.ts";

type Env = { Variables: { accountId: string } };

/** The longest long poll, in seconds: well under the server's idle timeout (60 s). */
export const MAX_WAIT_SECONDS = 20;

export function operationRoutes(deps: { store: PostgresStore; apiKeys: ApiKeys }): Hono<Env> {
  const app = new Hono<Env>();
  const authorize = replayAuthorized<Env>(deps.apiKeys);
  const lookup = operationLookup<Context<Env>>({
    read: operationReader(deps.store),
    scope: (_request, c) => c.var.accountId,
    authorizeReplay: (_request, c) => authorize(c),
    maxWaitSeconds: MAX_WAIT_SECONDS,
  });
  const auth = authenticate(deps.apiKeys) as unknown as MiddlewareHandler<Env>;
  // By reference, or (no reference) by the request's Idempotency-Key.
  app.get("/v1/operations/:ref", auth, (c) => lookup(c.req.raw, c));
  app.get("/v1/operations", auth, (c) => lookup(c.req.raw, c));
  return app;
}
