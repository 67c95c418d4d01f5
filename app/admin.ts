/**
 * The operations console at `/admin` and the admin API under `/admin/api/*`: idem/admin's
 * `adminConsole`, guarded by admin tokens of their own (IDEM_ADMIN_TOKEN): `name:token,...`, one per
 * person, whose name is recorded with every action; or one bare token, recorded as `admin`. Unset: both
 * answer 404 saying how to turn them on. The routes are `app.all` ones: the admin API is not part of the
 * service's public contract (/openapi.json).
 */
import { getConnInfo } from "@hono/node-server/conninfo";
import { Hono } from "hono";
import { adminConsole, adminProblem, bearerTokens, Operations, parseAdminTokens } from "idem/admin";
import type { Db, PostgresStore } from "idem/postgres";
import type { Logger } from "pino";

export interface AdminRoutesOptions {
  db: Db;
  store: PostgresStore;
  /** IDEM_ADMIN_TOKEN: `name:token,...` or one token. Unset or empty: the console is off. */
  tokens?: string;
  logger?: Logger;
}

/** The client's address, from the socket (undefined outside Node, e.g. `app.request` in a test). */
function sourceOf(c: Parameters<typeof getConnInfo>[0]): string | undefined {
  try {
    return getConnInfo(c).remote.address;
  } catch {
    return undefined;
  }
}

export function adminRoutes(o: AdminRoutesOptions): Hono {
  const app = new Hono();
  const tokens = parseAdminTokens(o.tokens);
  const serve =
    tokens.length === 0
      ? () =>
          adminProblem(
            404,
            "admin-disabled",
            "The operations console is off: set IDEM_ADMIN_TOKEN (name:token,... one per person) to turn it on.",
          )
      : adminConsole({
          operations: new Operations({ store: o.store, db: o.db }),
          authorize: bearerTokens(tokens),
          basePath: "/admin",
          onError: (err) => o.logger?.error({ err }, "admin API failed"),
          onAuthFailure: (e) =>
            o.logger?.warn(e, e.limited ? "admin logins refused: too many failures" : "admin login failed"),
        });
  // Failed authentications are limited and recorded per client address (the socket's: this service
  // is not behind a proxy it trusts to say who the client is).
  app.all("/admin", (c) => serve(c.req.raw, { source: sourceOf(c) }));
  app.all("/admin/*", (c) => serve(c.req.raw, { source: sourceOf(c) }));
  return app;
}
