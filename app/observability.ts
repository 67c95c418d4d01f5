/**
 * Logs and metrics for the reference service.
 *
 * Logs: pino, one JSON line each; every line a request writes carries `req_id`, `idempotency_key`
 * and (once authenticated) `scope`, so "I was charged twice" is one grep away.
 * Metrics: prom-client, served at `/metrics` in the Prometheus text format.
 */
import { randomUUID } from "node:crypto";
import type { MiddlewareHandler } from "hono";
import { routePath } from "hono/route";
import { Outcome, parseIdempotencyKey } from "idem";
import { idempotencyOutcome } from "idem/hono";
import type { IdemGauges } from "idem/messaging";
import pino, { type Logger } from "pino";
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from "prom-client";

declare module "hono" {
  interface ContextVariableMap {
    /** This request's logger (bound to its request id, idempotency key and, after auth, scope). */
    log: Logger;
  }
}

export function createLogger(options: { level?: string; destination?: pino.DestinationStream } = {}): Logger {
  return pino(
    { level: options.level ?? process.env.LOG_LEVEL ?? "info", base: { service: "idem-payments" } },
    options.destination,
  );
}

export interface Metrics {
  registry: Registry;
  requests: Counter<"route" | "method" | "outcome" | "status">;
  latency: Histogram<"route" | "method" | "outcome">;
  leaseTakeovers: Counter;
  completerRuns: Counter<"result">;
  outboxLag: Gauge;
  keysNeedingReview: Gauge;
}

/** The service's metrics. `outboxLagSeconds` and `openReviews` are read at scrape time. */
export function createMetrics(
  outboxLagSeconds?: () => Promise<number>,
  openReviews?: () => Promise<number>,
): Metrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  return {
    registry,
    requests: new Counter({
      name: "idem_http_requests_total",
      help: "HTTP requests by route and how they ended (executed, replayed, in_flight, mismatch, invalid, ...)",
      labelNames: ["route", "method", "outcome", "status"],
      registers: [registry],
    }),
    latency: new Histogram({
      name: "idem_http_request_duration_seconds",
      help: "HTTP request latency by route and outcome",
      labelNames: ["route", "method", "outcome"],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers: [registry],
    }),
    leaseTakeovers: new Counter({
      name: "idem_lease_takeovers_total",
      help: "Phases-mode leases taken over from a worker whose lease had expired",
      registers: [registry],
    }),
    completerRuns: new Counter({
      name: "idem_completer_runs_total",
      help: "Abandoned phases-mode keys the completer tried to finish, by result",
      labelNames: ["result"],
      registers: [registry],
    }),
    outboxLag: new Gauge({
      name: "idem_outbox_lag_seconds",
      help: "Age of the oldest unpublished outbox event (0 when the outbox is empty)",
      registers: [registry],
      async collect() {
        if (outboxLagSeconds) this.set(await outboxLagSeconds().catch(() => Number.NaN));
      },
    }),
    keysNeedingReview: new Gauge({
      name: "idem_keys_needs_review",
      help: "Phases-mode keys whose outcome is unknown, waiting for a person (idem keys list --state needs_review)",
      registers: [registry],
      async collect() {
        if (openReviews) this.set(await openReviews().catch(() => Number.NaN));
      },
    }),
  };
}

/**
 * The gauges of idem's tables (issue 16), each read by its own bounded SQL statement at scrape time:
 * unfinished keys by recovery point, the oldest one's age, parked outbox events, parked inbox messages
 * and the relay's lag. A read that fails leaves NaN (the scrape still answers).
 */
export function registerIdemGauges(registry: Registry, gauges: IdemGauges): void {
  const value = (name: string, help: string, read: () => Promise<number>) =>
    new Gauge({
      name,
      help,
      registers: [registry],
      async collect() {
        this.set(await read().catch(() => Number.NaN));
      },
    });
  new Gauge({
    name: "idem_keys_unfinished",
    help: "Phases-mode keys not finished yet, by recovery point (counted up to 100,000)",
    labelNames: ["recovery_point"],
    registers: [registry],
    async collect() {
      const byPoint = await gauges.unfinishedKeys().catch(() => undefined);
      this.reset();
      for (const [point, n] of Object.entries(byPoint ?? {})) this.set({ recovery_point: point }, n);
    },
  });
  value(
    "idem_keys_unfinished_oldest_seconds",
    "Seconds since the least recently advanced unfinished key last moved (0 when none)",
    () => gauges.oldestUnfinishedKeySeconds(),
  );
  value(
    "idem_outbox_parked",
    "Outbox events parked after their last failed publish, waiting for a requeue",
    () => gauges.parkedOutboxEvents(),
  );
  value(
    "idem_inbox_parked",
    "Inbox messages parked after their last failed attempt, waiting for an unpark",
    () => gauges.parkedInboxMessages(),
  );
  value(
    "idem_relay_lag_seconds",
    "Age of the oldest event waiting to be published, parked ones aside (0 when none)",
    () => gauges.relayLagSeconds(),
  );
}

/**
 * First middleware of the app: gives the request an id and a logger, and when it ends writes one
 * access line and counts it by outcome (`idempotencyOutcome(c)`, set by idem's middleware).
 */
export function observe(logger: Logger, metrics: Metrics): MiddlewareHandler {
  return async function observeMiddleware(c, next) {
    const started = performance.now();
    const reqId = (c.req.header("x-request-id") ?? "").slice(0, 128) || randomUUID();
    let key: string | undefined;
    try {
      key = parseIdempotencyKey(c.req.header("idempotency-key"));
    } catch {
      key = undefined; // invalid keys are answered 400 by idem; not worth a log field
    }
    c.set("log", logger.child({ req_id: reqId, ...(key ? { idempotency_key: key } : {}) }));
    await next();
    c.header("x-request-id", reqId);
    // The route that answered (the last one matched), as a pattern: bounded label cardinality.
    const matched = routePath(c, -1);
    const route = matched && matched !== "/*" && matched !== "*" ? matched : "unmatched";
    const outcome = idempotencyOutcome(c) ?? (c.error ? "error" : "none");
    const seconds = (performance.now() - started) / 1000;
    metrics.requests.inc({ route, method: c.req.method, outcome, status: String(c.res.status) });
    metrics.latency.observe({ route, method: c.req.method, outcome }, seconds);
    c.var.log.info(
      {
        method: c.req.method,
        path: new URL(c.req.url).pathname,
        status: c.res.status,
        outcome,
        ms: Math.round(seconds * 1000),
      },
      "request",
    );
  };
}

export { Outcome };
