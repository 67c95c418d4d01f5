/**
 * A small Hono app over idem's PostgresStore on PGlite (the real PostgreSQL engine, in process), for
 * the core rules tests: requests go through `app.request` (a real `Request`, no socket), so a test file
 * starts in about a second. The handler counts how often it ran per key and answers what the request
 * asks for: `x-status` (default 201) and `x-reply-headers` (a JSON object of headers to send). The
 * scope is `acct_1`, or none (not authenticated) when the request sends `x-anonymous`.
 */
import { PGlite } from "@electric-sql/pglite";
import { Hono } from "hono";
import { encodeOperationRef } from "../../src/core/index.ts";
import { type IdempotencyEnv, idempotency } from "../../src/http/hono.ts";
import { fromPglite, migrate, PostgresStore } from "../../src/postgres/index.ts";

export interface RulesApp {
  /** Send a request to `path` (default POST with a JSON body). */
  send(path: string, init: RequestInit & { key?: string }): Promise<Response>;
  /** How often the handler ran. */
  runs(): number;
  /** The operation_ref of a key of this app's scope. */
  encodeRef(key: string): string;
  close(): Promise<void>;
}

export type RouteOptions = Omit<Parameters<typeof idempotency>[0], "store" | "scope">;

/** One app per test file: `routes` maps a path prefix to the idempotency options of that route. */
export async function startRulesApp(routes: Record<string, RouteOptions>): Promise<RulesApp> {
  const db = fromPglite(await PGlite.create());
  await migrate(db);
  const store = await PostgresStore.open(db);
  let runs = 0;
  const app = new Hono<IdempotencyEnv>();
  for (const [prefix, options] of Object.entries(routes)) {
    app.all(
      `${prefix}/*`,
      idempotency({ ...options, store, scope: (c) => (c.req.header("x-anonymous") ? undefined : "acct_1") }),
      (c) => {
        runs++;
        const headers = JSON.parse(c.req.header("x-reply-headers") ?? "{}") as Record<string, string>;
        const status = Number(c.req.header("x-status") ?? 201);
        return c.body(JSON.stringify({ run: runs, body: c.var.idempotency.body }), status as 201, {
          "content-type": "application/json",
          ...headers,
        });
      },
    );
  }
  return {
    send(path, { key, headers, ...init }) {
      const h = new Headers(headers);
      if (key !== undefined) h.set("idempotency-key", key);
      return Promise.resolve(app.request(`http://idem.test${path}`, { method: "POST", ...init, headers: h }));
    },
    runs: () => runs,
    encodeRef: (key: string) => encodeOperationRef("acct_1", key),
    close: () => db.close(),
  };
}
