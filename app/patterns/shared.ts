/** What every pattern's routes share: the app's environment and the middlewares made once for them. */
import type { MiddlewareHandler } from "hono";
import type { IdempotencyEnv } from "idem/hono";
import type { Db } from "idem/postgres";

export type PatternEnv = { Variables: { accountId: string } };

export interface PatternDeps {
  db: Db;
  /** The body limit (413 past it). */
  limit: MiddlewareHandler;
  /** API-key authentication: sets `accountId`. */
  auth: MiddlewareHandler<PatternEnv>;
  /** idem's `idempotency()` for a keyed route in atomic mode. */
  keyed: MiddlewareHandler<IdempotencyEnv>;
}
