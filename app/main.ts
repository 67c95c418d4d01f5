/**
 * The reference payments service: `npm start` (or `idem serve`). This file wires it: the settings
 * come from app/config.ts (every environment variable, checked there), the process signals are
 * handled by app/signals.ts. `start(env)` builds the service and returns how to stop it.
 */
import { randomBytes } from "node:crypto";
import { Hono } from "hono";
import { IdemGauges } from "idem/messaging";
import { PostgresStore, reviewGauge } from "idem/postgres";
import { startProvider } from "idem/testing";
import { ApiKeys, DEMO_ACCOUNTS, ensureDemoAccounts } from "./accounts.ts";
import { createApp } from "./app.ts";
import { startCheckoutSaga } from "./checkout/worker.ts";
import { type Env, loadConfig } from "./config.ts";
import { ensureSchema, openDatabase } from "./database.ts";
import { metricsRoutes } from "./metrics-route.ts";
import { createLogger, createMetrics, registerIdemGauges } from "./observability.ts";
import { DECLINED_TEST_CARD, paymentPhasesRunner } from "./payments-phases.ts";
import { startReceipts } from "./receipts.ts";
import { drain, listen as listenHttp, portInUse } from "./server.ts";
import { runUntilSignalled } from "./signals.ts";
import { startUpkeep } from "./upkeep.ts";

export async function start(env: Env = process.env) {
  const config = loadConfig(env);
  const { port, host, limits, metricsPort, paymentsMode: mode, sealer } = config;
  const providerIdempotency = config.provider.idempotency;
  const logger = createLogger({ level: config.logLevel });
  const { db, listen, embedded, where } = await openDatabase(config.database);
  // No DDL when the schema is current: the service's role may have DML rights only.
  await ensureSchema(db).catch(async (err) => {
    await db.close().catch(() => {});
    throw err;
  });
  const demo = embedded || config.demo;
  if (demo) await ensureDemoAccounts(db);
  const store = await PostgresStore.open(db, {
    retentionMs: config.retentionMs,
    sealer,
  });

  // The receipt-email worker: outbox -> broker (AMQP_URL, NATS_URL, KAFKA_URL, SQS_URL, else in process)
  // -> inbox -> email.
  const receipts = await startReceipts(db, {
    ...config.receipts,
    listen,
    log: (line) => logger.info(line, "receipts"),
  });

  let providerUrl = config.provider.url;
  // The provider's charge webhooks (POST /v1/webhooks/provider): the in-process simulator sends them
  // once this service listens, signed with this secret.
  const webhookSecret = config.provider.webhookSecret ?? `whsec_${randomBytes(24).toString("base64")}`;
  let webhookUrl: string | undefined;
  let provider: Awaited<ReturnType<typeof startProvider>> | undefined;
  if (mode === "phases" && !providerUrl) {
    provider = await startProvider({
      port: config.provider.port,
      host: "127.0.0.1",
      declineCards: [DECLINED_TEST_CARD],
      retentionMs: config.provider.retentionMs,
      idempotency: providerIdempotency,
      webhooks: { url: () => webhookUrl, secret: webhookSecret },
    }).catch((err: unknown) => {
      throw portInUse(err, config.provider.port, "PROVIDER_PORT");
    });
    providerUrl = provider.url;
  }
  // The checkout saga (app/checkout/): reserve -> charge -> ship, compensated, through outbox and inbox.
  const saga = providerUrl
    ? await startCheckoutSaga(
        db,
        { store, providerUrl },
        {
          ...config.receipts,
          listen,
          log: (line) => logger.info(line, "checkout saga"),
        },
      )
    : undefined;

  const metrics = createMetrics(undefined, async () => (await reviewGauge(store)).open);
  registerIdemGauges(metrics.registry, new IdemGauges(db));
  const app = createApp({
    db,
    store,
    apiKeys: new ApiKeys(db),
    paymentsMode: mode,
    providerUrl,
    providerIdempotency,
    cardTokenKey: config.cardTokenKey,
    requireKey: config.requireKey,
    logger,
    metrics,
    // The playground pays as the demo account without an API key: only where the demo accounts exist.
    playground: demo,
    emailWorker: true, // startReceipts above
    metricsEndpoint: metricsPort === undefined ? { token: config.metricsToken } : false,
    regions: config.regions,
    adminTokens: config.adminTokens, // the operations console at /admin (app/admin.ts); unset: off
    providerWebhookSecret: webhookSecret,
  });
  const server = await listenHttp(app.fetch, { port, host, limits, setting: "PORT" });
  let metricsServer: Awaited<ReturnType<typeof listenHttp>> | undefined;
  if (metricsPort !== undefined) {
    // /metrics on its own port, for a scraper on a private network; the API port does not serve it.
    const metricsApp = new Hono();
    metricsApp.route("/", metricsRoutes(metrics, config.metricsToken));
    metricsServer = await listenHttp(metricsApp.fetch, {
      port: metricsPort,
      host,
      limits,
      setting: "METRICS_PORT",
    });
  }
  const address = server.address();
  const actualPort = typeof address === "object" && address ? address.port : port;
  const local = host === "0.0.0.0" || host === "::" ? "127.0.0.1" : host;
  webhookUrl = `http://${local.includes(":") ? `[${local}]` : local}:${actualPort}/v1/webhooks/provider`;
  console.log(`idem payments service on http://${host}:${actualPort} (database: ${where})`);
  if (mode === "phases")
    console.log(`  payment provider: ${providerUrl}${provider ? " (simulator, in process)" : ""}`);
  else console.log("  payments in atomic mode (no provider)");
  console.log(`  receipt emails: outbox -> ${receipts.transport} -> inbox`);
  if (saga) console.log(`  checkout saga: outbox -> ${saga.transport} -> inbox (POST /v1/checkouts)`);
  console.log(`  MCP tools for agents: POST http://${host}:${actualPort}/mcp (docs/mcp.md)`);
  if (demo) {
    for (const a of DEMO_ACCOUNTS) console.log(`  demo account ${a.id}: Authorization: Bearer ${a.apiKey}`);
    if (mode === "phases") console.log(`  playground: http://${host}:${actualPort}/`);
  }

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
  const upkeep = startUpkeep({ db, store, runners, metrics, logger });

  let stopping: Promise<void> | undefined;
  const stop = () => {
    stopping ??= (async () => {
      const began = performance.now();
      logger.info({ drain_ms: limits.drainMs }, "shutdown began: no new connections, draining requests");
      upkeep.stop();
      // Stop accepting; requests in flight finish (their phases complete or free their leases) within
      // the drain deadline, after which the connections still open are cut.
      const [{ cut }] = await Promise.all([
        drain(server, limits.drainMs),
        metricsServer ? drain(metricsServer, limits.drainMs) : Promise.resolve({ cut: 0 }),
      ]);
      await receipts.stop();
      await saga?.stop();
      await provider?.close();
      await store.retire().catch(() => {}); // a key promotion no longer waits for this instance
      await db.close();
      logger.info({ ms: Math.round(performance.now() - began), connections_cut: cut }, "shutdown ended");
    })();
    return stopping;
  };
  return { port: actualPort, stop, server, providerUrl };
}

if (import.meta.url === `file://${process.argv[1]}`) runUntilSignalled(start());
