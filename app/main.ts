/**
 * The reference payments service: `npm start` (or `idem serve`).
 *
 * Environment (all optional):
 *   PORT                  HTTP port (default 3000; 0 picks a free one)
 *   HOST                  interface (default 127.0.0.1)
 *   DATABASE_URL          PostgreSQL (default: the embedded PGlite under .idem/); several hosts with
 *                         target_session_attrs=read-write run on postgres.js; ?pgbouncer=true optional
 *   IDEM_LISTEN_DATABASE_URL  straight to PostgreSQL for LISTEN when DATABASE_URL is a pooler
 *   IDEM_DB_DRIVER        pg, postgres or auto (default auto: postgres.js for several hosts)
 *   PROVIDER_URL          the payment provider (default: the simulator, started in this process)
 *   PROVIDER_PORT         port of that in-process simulator (default 4100; 0 picks a free one)
 *   PROVIDER_RETENTION_MS how long that simulator remembers a key and its charge (default 86400000, 24 h)
 *   PROVIDER_IDEMPOTENCY  false: the provider does not dedup by Idempotency-Key (lookup mode: charges carry
 *                         our reference and an unknown outcome is searched for before charging again);
 *                         the in-process simulator then runs without idempotency too (default true)
 *   IDEM_PAYMENTS_MODE    phases (default) or atomic (local payments only, no provider)
 *   AMQP_URL / NATS_URL   the broker for receipt emails (default: an in-process transport)
 *   IDEM_DEMO=1           create the demo accounts on a real server too
 *   IDEM_RETENTION_HOURS  how long idempotency keys are kept (default 24)
 *   IDEM_ENCRYPTION_KEYS  encrypt saved replies and stored inputs at rest: `id:base64-32-bytes,...`,
 *                         the current key first (docs/operations.md, "Encryption at rest")
 *   METRICS_PORT          serve /metrics on its own port (on HOST) instead of the API's
 *   IDEM_METRICS_TOKEN    require `Authorization: Bearer <token>` on /metrics
 *   IDEM_ADMIN_TOKEN      turn on the operations console at /admin: `name:token,...` (one per person)
 *   LOG_LEVEL             pino level (default info)
 * HTTP limits and the shutdown drain: see app/server.ts (IDEM_HTTP_*, IDEM_DRAIN_MS).
 *   IDEM_REGION, IDEM_REGION_URLS, IDEM_ACCOUNT_HOMES   run as one of several regions (app/regions.ts)
 */
import { Hono } from "hono";
import { sealerFromEnv } from "idem";
import { IdemGauges, sweepInbox } from "idem/messaging";
import { complete, PartitionMissingError, PostgresStore, reviewGauge } from "idem/postgres";
import { startProvider } from "idem/testing";
import { ApiKeys, DEMO_ACCOUNTS, ensureDemoAccounts } from "./accounts.ts";
import { createApp } from "./app.ts";
import { ensureSchema, openDatabase } from "./database.ts";
import { metricsRoutes } from "./metrics-route.ts";
import { createLogger, createMetrics, registerIdemGauges } from "./observability.ts";
import { DECLINED_TEST_CARD, paymentPhasesRunner, providerIdempotencyFrom } from "./payments-phases.ts";
import { receiptsConfigFromEnv, startReceipts } from "./receipts.ts";
import { regionsFromEnv } from "./regions.ts";
import { drain, httpLimitsFromEnv, listen as listenHttp, portFrom, portInUse } from "./server.ts";

export async function start(env: NodeJS.ProcessEnv = process.env) {
  const port = portFrom(env, "PORT", 3000);
  const providerPort = portFrom(env, "PROVIDER_PORT", 4100);
  const metricsPort = env.METRICS_PORT ? portFrom(env, "METRICS_PORT", 0) : undefined;
  const limits = httpLimitsFromEnv(env);
  const host = env.HOST ?? "127.0.0.1";
  const retentionHours = Number(env.IDEM_RETENTION_HOURS ?? 24);
  if (!(retentionHours > 0)) {
    throw new Error(
      `IDEM_RETENTION_HOURS must be a positive number of hours, got ${env.IDEM_RETENTION_HOURS}`,
    );
  }
  const mode = env.IDEM_PAYMENTS_MODE ?? "phases";
  if (mode !== "phases" && mode !== "atomic") {
    throw new Error(`IDEM_PAYMENTS_MODE must be phases or atomic, got ${mode}`);
  }
  const providerIdempotency = providerIdempotencyFrom(env);
  const sealer = sealerFromEnv(env); // undefined when IDEM_ENCRYPTION_KEYS is unset: stored in clear
  const logger = createLogger({ level: env.LOG_LEVEL });
  const driver = env.IDEM_DB_DRIVER || undefined;
  if (driver !== undefined && driver !== "pg" && driver !== "postgres" && driver !== "auto") {
    throw new Error(`IDEM_DB_DRIVER must be pg, postgres or auto, got ${driver}`);
  }
  const { db, listen, embedded, where } = await openDatabase({
    url: env.DATABASE_URL || undefined,
    dataDir: env.IDEM_DATA_DIR,
    poolSize: env.IDEM_POOL_SIZE ? Number(env.IDEM_POOL_SIZE) : undefined,
    listenUrl: env.IDEM_LISTEN_DATABASE_URL || undefined,
    driver,
  });
  // No DDL when the schema is current: the service's role may have DML rights only.
  await ensureSchema(db).catch(async (err) => {
    await db.close().catch(() => {});
    throw err;
  });
  const demo = embedded || env.IDEM_DEMO === "1";
  if (demo) await ensureDemoAccounts(db);
  const store = await PostgresStore.open(db, {
    retentionMs: retentionHours * 3_600_000,
    sealer,
  });

  // The receipt-email worker: outbox -> broker (AMQP_URL, NATS_URL, else in process) -> inbox -> email.
  const receipts = await startReceipts(db, {
    ...receiptsConfigFromEnv(env),
    listen,
    log: (line) => logger.info(line, "receipts"),
  });

  let providerUrl = env.PROVIDER_URL || undefined;
  let provider: Awaited<ReturnType<typeof startProvider>> | undefined;
  if (mode === "phases" && !providerUrl) {
    provider = await startProvider({
      port: providerPort,
      host: "127.0.0.1",
      declineCards: [DECLINED_TEST_CARD],
      retentionMs: env.PROVIDER_RETENTION_MS ? Number(env.PROVIDER_RETENTION_MS) : undefined,
      idempotency: providerIdempotency,
    }).catch((err: unknown) => {
      throw portInUse(err, providerPort, "PROVIDER_PORT");
    });
    providerUrl = provider.url;
  }

  const metrics = createMetrics(undefined, async () => (await reviewGauge(store)).open);
  registerIdemGauges(metrics.registry, new IdemGauges(db));
  const app = createApp({
    db,
    store,
    apiKeys: new ApiKeys(db),
    paymentsMode: mode,
    providerUrl,
    providerIdempotency,
    // IDEM_OPTIONAL_KEY=1 lets POSTs without a key through (the benchmark's baseline); never in production.
    requireKey: env.IDEM_OPTIONAL_KEY !== "1",
    logger,
    metrics,
    // The playground pays as the demo account without an API key: only where the demo accounts exist.
    playground: demo,
    emailWorker: true, // startReceipts above
    metricsEndpoint: metricsPort === undefined ? { token: env.IDEM_METRICS_TOKEN } : false,
    regions: regionsFromEnv(env),
    adminTokens: env.IDEM_ADMIN_TOKEN, // the operations console at /admin (app/admin.ts); unset: off
  });
  const server = await listenHttp(app.fetch, { port, host, limits, setting: "PORT" });
  let metricsServer: Awaited<ReturnType<typeof listenHttp>> | undefined;
  if (metricsPort !== undefined) {
    // /metrics on its own port, for a scraper on a private network; the API port does not serve it.
    const metricsApp = new Hono();
    metricsApp.route("/", metricsRoutes(metrics, env.IDEM_METRICS_TOKEN));
    metricsServer = await listenHttp(metricsApp.fetch, {
      port: metricsPort,
      host,
      limits,
      setting: "METRICS_PORT",
    });
  }
  const address = server.address();
  const actualPort = typeof address === "object" && address ? address.port : port;
  console.log(`idem payments service on http://${host}:${actualPort} (database: ${where})`);
  if (mode === "phases")
    console.log(`  payment provider: ${providerUrl}${provider ? " (simulator, in process)" : ""}`);
  else console.log("  payments in atomic mode (no provider)");
  console.log(`  receipt emails: outbox -> ${receipts.transport} -> inbox`);
  if (demo) {
    for (const a of DEMO_ACCOUNTS) console.log(`  demo account ${a.id}: Authorization: Bearer ${a.apiKey}`);
    if (mode === "phases") console.log(`  playground: http://${host}:${actualPort}/`);
  }

  // Background upkeep: retention (drop expired partitions) and the completer (finish payments whose
  // clients never came back). Each instance may run them; both are safe to run concurrently.
  // Inbox dedup marks are kept a week (their partitions dropped after): far past any redelivery.
  const sweep = setInterval(
    () =>
      Promise.all([store.sweep(), sweepInbox(db, { retentionMs: 7 * 24 * 3_600_000 })]).catch((err) =>
        err instanceof PartitionMissingError || err?.code === "42501"
          ? logger.warn("sweep skipped: this role may not run DDL; run `idem sweep` hourly as the owner")
          : logger.error({ err }, "sweep failed"),
      ),
    3_600_000,
  );
  const runners =
    mode === "phases" && providerUrl
      ? [
          paymentPhasesRunner({
            store,
            providerUrl,
            providerIdempotency,
            onLeaseTakeover: () => metrics.leaseTakeovers.inc(),
          }),
        ]
      : [];
  const completer = setInterval(() => {
    if (!runners.length) return;
    complete({ store, runners, olderThanMs: 60_000 }).then(
      (r) => {
        for (const [result, n] of Object.entries(r.counts)) if (n) metrics.completerRuns.inc({ result }, n);
        if (r.found) logger.info({ counts: r.counts }, "completer finished abandoned keys");
      },
      (err) => logger.error({ err }, "completer failed"),
    );
  }, 30_000);
  sweep.unref();
  completer.unref();

  let stopping: Promise<void> | undefined;
  const stop = () => {
    stopping ??= (async () => {
      const began = performance.now();
      logger.info({ drain_ms: limits.drainMs }, "shutdown began: no new connections, draining requests");
      clearInterval(sweep);
      clearInterval(completer);
      // Stop accepting; requests in flight finish (their phases complete or free their leases) within
      // the drain deadline, after which the connections still open are cut.
      const [{ cut }] = await Promise.all([
        drain(server, limits.drainMs),
        metricsServer ? drain(metricsServer, limits.drainMs) : Promise.resolve({ cut: 0 }),
      ]);
      await receipts.stop();
      await provider?.close();
      await store.retire().catch(() => {}); // a key promotion no longer waits for this instance
      await db.close();
      logger.info({ ms: Math.round(performance.now() - began), connections_cut: cut }, "shutdown ended");
    })();
    return stopping;
  };
  return { port: actualPort, stop, server, providerUrl };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  start().then(
    ({ stop }) => {
      for (const sig of ["SIGINT", "SIGTERM"] as const) {
        process.once(sig, () => {
          stop().then(() => process.exit(0));
        });
      }
    },
    (err: Error) => {
      console.error(`idem: ${err.message}`);
      process.exit(1);
    },
  );
}
