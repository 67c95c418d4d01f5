/**
 * The operations console at `/admin` (app/admin/) and the admin API under `/admin/api/*` (idem/admin's
 * `adminHandler`), guarded by admin tokens of their own (IDEM_ADMIN_TOKEN): `name:token,...`, one per
 * person, whose name is recorded with every action; or one bare token, recorded as `admin`. Unset: both
 * answer 404 saying how to turn them on. The page itself holds no data: it asks for a token and calls
 * the API with it (`Authorization: Bearer`, never a cookie, so no other site can act through a visitor's
 * browser). The routes are `app.all` ones: the admin API is not part of the service's public contract
 * (/openapi.json).
 */
import { readFile } from "node:fs/promises";
import { getConnInfo } from "@hono/node-server/conninfo";
import { Hono } from "hono";
import { adminHandler, adminProblem, bearerTokens, Operations, parseAdminTokens } from "idem/admin";
import type { Db, PostgresStore } from "idem/postgres";
import type { Logger } from "pino";

export interface AdminRoutesOptions {
  db: Db;
  store: PostgresStore;
  /** IDEM_ADMIN_TOKEN: `name:token,...` or one token. Unset or empty: the console is off. */
  tokens?: string;
  logger?: Logger;
}

const STATIC: Record<string, [file: string, type: string]> = {
  "/admin": ["admin/index.html", "text/html; charset=utf-8"],
  "/admin/admin.js": ["admin/admin.js", "text/javascript; charset=utf-8"],
  "/admin/admin.css": ["admin/admin.css", "text/css; charset=utf-8"],
  // The playground's look, shared.
  "/admin/playground.css": ["playground/playground.css", "text/css; charset=utf-8"],
  "/admin/favicon.svg": ["playground/favicon.svg", "image/svg+xml"],
};

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
  if (tokens.length === 0) {
    const off = () =>
      adminProblem(
        404,
        "admin-disabled",
        "The operations console is off: set IDEM_ADMIN_TOKEN (name:token,... one per person) to turn it on.",
      );
    app.all("/admin", off);
    app.all("/admin/*", off);
    return app;
  }
  const api = adminHandler({
    operations: new Operations({ store: o.store, db: o.db }),
    authorize: bearerTokens(tokens),
    basePath: "/admin/api",
    onError: (err) => o.logger?.error({ err }, "admin API failed"),
    onAuthFailure: (e) =>
      o.logger?.warn(e, e.limited ? "admin logins refused: too many failures" : "admin login failed"),
  });
  // Failed authentications are limited and recorded per client address (the socket's: this service
  // is not behind a proxy it trusts to say who the client is).
  app.all("/admin/api/*", (c) => api(c.req.raw, { source: sourceOf(c) }));
  const dir = new URL("./", import.meta.url);
  const page = async (path: string) => {
    const [file, type] = STATIC[path]!;
    return new Response(await readFile(new URL(file, dir)), {
      headers: {
        "content-type": type,
        "cache-control": "no-store",
        // The page runs only its own script and talks only to its own origin.
        "content-security-policy":
          "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'",
        "x-content-type-options": "nosniff",
      },
    });
  };
  const serveStatic = (c: { req: { method: string; path: string } }) => {
    const path = c.req.path.replace(/\/$/, "") || "/admin";
    if (!STATIC[path]) return adminProblem(404, "not-found", `No admin page at ${c.req.path}.`);
    if (c.req.method !== "GET" && c.req.method !== "HEAD") {
      return adminProblem(405, "method-not-allowed", `${path} takes GET.`, { allow: "GET, HEAD" });
    }
    return page(path);
  };
  app.all("/admin", serveStatic);
  app.all("/admin/*", serveStatic);
  return app;
}
