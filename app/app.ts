import { Hono } from "hono";
import { AbandonedWorkError } from "idem";
import { IdemGauges } from "idem/messaging";
import { type Db, type PostgresStore, reviewGauge } from "idem/postgres";
import type { Logger } from "pino";
import type { ApiKeys } from "./accounts.ts";
import { adminRoutes } from "./admin.ts";
import { mcpRoutes } from "./mcp-route.ts";
import { metricsRoutes } from "./metrics-route.ts";
import { createLogger, createMetrics, type Metrics, observe } from "./observability.ts";
import { openApiDocument } from "./openapi.ts";
import { operationRoutes } from "./operations.ts";
import { patternRoutes } from "./patterns.ts";
import { paymentRoutes } from "./payments.ts";
import { paymentPhasesRoutes } from "./payments-phases.ts";
import { playgroundRoutes } from "./playground.ts";
import { problem, unavailableProblem } from "./problems.ts";
import { providerWebhookRoutes } from "./provider-webhooks.ts";
import { type Regions, regionRouting } from "./regions.ts";
import { plainPathAndQuery } from "./validate.ts";

export interface AppDeps {
  db: Db;
  store: PostgresStore;
  apiKeys: ApiKeys;
  /**
   * `phases` (default): payments charge the provider at `providerUrl` through recovery points.
   * `atomic`: payments are local rows only, in atomic mode (the first cut; the benchmark's baseline).
   */
  paymentsMode?: "phases" | "atomic";
  /** The payment provider (simulator) base URL. Required in phases mode. */
  providerUrl?: string;
  /**
   * Whether the provider dedups by Idempotency-Key. `false`: lookup mode (the charge carries our
   * reference, searched for after an unknown outcome). Default: true (PROVIDER_IDEMPOTENCY).
   */
  providerIdempotency?: boolean;
  /** The key card numbers are tokenized under (IDEM_CARD_TOKEN_KEY). Default: a random key per process. */
  cardTokenKey?: string;
  /** Atomic mode only: let POSTs without a key through (the benchmark's unkeyed baseline). */
  requireKey?: boolean;
  /** Default: a pino logger on stdout at LOG_LEVEL (info). */
  logger?: Logger;
  /** Default: fresh metrics (the outbox lag read by idem's `IdemGauges.relayLagSeconds`). */
  metrics?: Metrics;
  /**
   * Serve `GET /metrics` on this app, optionally behind a bearer token; `false` when it is served on a
   * port of its own (METRICS_PORT). Default: served, no token.
   */
  metricsEndpoint?: { token?: string } | false;
  /**
   * Serve the playground page at `/` and its endpoints under `/playground/api/*` (phases mode only). They
   * pay as the demo account without an API key: only with the demo accounts, never otherwise. Default: false.
   */
  playground?: boolean;
  /** Run as one of several regions (app/regions.ts): writes go to the account's home region. */
  regions?: Regions;
  /** Whether the receipt-email worker runs (app/receipts.ts), for the playground. Default: false. */
  emailWorker?: boolean;
  /** IDEM_ADMIN_TOKEN: the operations console at /admin and its API (app/admin.ts). Unset: off. */
  adminTokens?: string;
  /** The provider's webhook secret: POST /v1/webhooks/provider takes its charge events. Unset: off. */
  providerWebhookSecret?: string;
}

/** The reference payments service as a Hono app (served by app/main.ts; tests drive it over HTTP). */
export function createApp(deps: AppDeps): Hono {
  const logger = deps.logger ?? createLogger();
  const metrics =
    deps.metrics ??
    createMetrics(
      () => new IdemGauges(deps.db).relayLagSeconds(),
      async () => (await reviewGauge(deps.store)).open,
    );
  const app = new Hono();
  app.use("*", observe(logger, metrics));
  app.use("*", plainPathAndQuery());

  app.get("/health", async (c) => {
    try {
      await deps.db.query("SELECT 1");
    } catch (err) {
      c.var.log.error({ err }, "health check: database unreachable");
      return (
        unavailableProblem(err) ??
        problem(503, "database-unavailable", "The database does not answer.", [["retry-after", "1"]])
      );
    }
    return c.json({ status: "ok", database: "ok", retention_seconds: deps.store.retentionMs / 1000 });
  });
  const metricsEndpoint = deps.metricsEndpoint ?? {};
  if (metricsEndpoint) app.route("/", metricsRoutes(metrics, metricsEndpoint.token));

  // Before region routing: a provider's webhook names no account, and any region may take it.
  if (deps.providerWebhookSecret)
    providerWebhookRoutes(app, { db: deps.db, secret: deps.providerWebhookSecret, logger });
  if (deps.regions) app.use("/v1/*", regionRouting(deps.regions, deps.apiKeys));
  if ((deps.paymentsMode ?? "phases") === "phases") {
    if (!deps.providerUrl) throw new Error("phases mode needs providerUrl (PROVIDER_URL)");
    app.route(
      "/",
      paymentPhasesRoutes({
        ...deps,
        providerUrl: deps.providerUrl,
        onLeaseTakeover: () => metrics.leaseTakeovers.inc(),
      }),
    );
  } else {
    app.route("/", paymentRoutes(deps));
  }
  app.route("/", patternRoutes(deps));
  app.route("/", operationRoutes(deps));
  const phases = (deps.paymentsMode ?? "phases") === "phases";
  const openapi = openApiDocument({
    ...deps,
    retentionMs: deps.store.retentionMs,
    lockTimeoutMs: deps.store.lockTimeoutMs,
    playground: deps.playground && phases,
    providerWebhooks: Boolean(deps.providerWebhookSecret),
  });
  app.get("/openapi.json", (c) => c.json(openapi));
  if (deps.playground && phases && deps.providerUrl) {
    app.route(
      "/",
      playgroundRoutes({ ...deps, providerUrl: deps.providerUrl, service: (r) => app.fetch(r) }),
    );
  }
  app.route("/", mcpRoutes(deps)); // POST /mcp: the payments API as tools for AI agents (app/mcp.ts)
  app.route("/", adminRoutes({ db: deps.db, store: deps.store, tokens: deps.adminTokens, logger }));
  app.notFound((c) => {
    const path = new URL(c.req.url).pathname;
    const allowed = allowedMethods(app, path);
    if (allowed.length > 0) {
      return problem(
        405,
        "method-not-allowed",
        `${path} does not take ${c.req.method}; it takes ${allowed.join(", ")}.`,
        [["allow", allowed.join(", ")]],
      );
    }
    return problem(404, "not-found", `No route for ${c.req.method} ${path}.`);
  });
  app.onError((err, c) => {
    // The database down, restarting or read-only after a failover, on any route (authentication
    // included): 503 with Retry-After, never 500.
    const unavailable = unavailableProblem(err);
    if (unavailable) {
      (c.var.log ?? logger).warn({ err }, "database unavailable");
      return unavailable;
    }
    // A retry's handler abandoned on a taken key (effectsInTxOnly): idem answers from the key; not an error.
    if (!(err instanceof AbandonedWorkError)) (c.var.log ?? logger).error({ err }, "unhandled error");
    return problem(
      500,
      "internal-error",
      "The server failed; nothing was saved, so a retry with the same key is safe.",
    );
  });
  return app;
}

/**
 * The methods the app's routes take on a path (HEAD with GET, as Hono answers it), for a 405's Allow
 * header; none when no route has the path. Middlewares (`app.use`, method ALL) are not routes.
 */
function allowedMethods(
  app: { routes: ReadonlyArray<{ method: string; path: string }> },
  path: string,
): string[] {
  const methods = new Set<string>();
  for (const route of app.routes) {
    if (route.method === "ALL") continue;
    const pattern = route.path
      .replace(/[.+?^${}()|[\]\\]/g, "\\$&")
      .replace(/:[^/]+/g, "[^/]+")
      .replace(/\*/g, ".*");
    if (new RegExp(`^${pattern}/?$`).test(path)) methods.add(route.method);
  }
  if (methods.has("GET")) methods.add("HEAD");
  return [...methods].sort();
}
