import { Hono } from "hono";
import type { AtomicStore } from "idem";
import type { Db, Tx } from "idem/postgres";
import type { ApiKeys } from "./accounts.ts";
import { patternRoutes } from "./patterns.ts";
import { paymentRoutes } from "./payments.ts";
import { problem } from "./problems.ts";

export interface AppDeps {
  db: Db;
  store: AtomicStore<Tx>;
  apiKeys: ApiKeys;
  requireKey?: boolean;
  log?: (line: Record<string, unknown>) => void;
}

/** The reference payments service as a Hono app (served by app/main.ts; tests drive it over HTTP). */
export function createApp(deps: AppDeps): Hono {
  const app = new Hono();
  app.get("/health", async (c) => {
    await deps.db.query("SELECT 1");
    return c.json({ status: "ok", retention_seconds: deps.store.retentionMs / 1000 });
  });
  app.route("/", paymentRoutes(deps));
  app.route("/", patternRoutes(deps));
  app.notFound((c) =>
    problem(404, "not-found", `No route for ${c.req.method} ${new URL(c.req.url).pathname}.`),
  );
  app.onError((err, _c) => {
    deps.log?.({ level: "error", msg: "unhandled error", err: String(err?.stack ?? err) });
    return problem(
      500,
      "internal-error",
      "The server failed; nothing was saved, so a retry with the same key is safe.",
    );
  });
  return app;
}
