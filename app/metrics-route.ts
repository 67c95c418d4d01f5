/**
 * `GET /metrics` (Prometheus text format). It shows every account's request counts, so it can be
 * protected: with a token, only `Authorization: Bearer <token>` gets it (401 otherwise); with
 * METRICS_PORT, it is served on its own port instead of the API's (app/main.ts).
 */
import { timingSafeEqual } from "node:crypto";
import { Hono } from "hono";
import type { Metrics } from "./observability.ts";
import { problem } from "./problems.ts";

function sameSecret(given: string, expected: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

export function metricsRoutes(metrics: Metrics, token: string | undefined): Hono {
  const app = new Hono();
  app.get("/metrics", async (c) => {
    if (token) {
      const m = /^Bearer\s+(\S+)\s*$/i.exec(c.req.header("authorization") ?? "");
      if (!m || !sameSecret(m[1]!, token)) {
        return problem(401, "unauthorized", "Send the metrics token as `Authorization: Bearer <token>`.", [
          ["www-authenticate", 'Bearer realm="idem-metrics"'],
        ]);
      }
    }
    c.header("content-type", metrics.registry.contentType);
    return c.body(await metrics.registry.metrics());
  });
  return app;
}
