/**
 * The reference payments service: `npm start` (or `idem serve`).
 *
 * Environment: PORT (default 3000), DATABASE_URL (default: embedded PGlite under .idem/), IDEM_DEMO=1
 * (create the demo accounts on a real server too), IDEM_RETENTION_HOURS (default 24).
 */
import { serve } from "@hono/node-server";
import { PostgresStore } from "idem/postgres";
import { ApiKeys, DEMO_ACCOUNTS, ensureDemoAccounts } from "./accounts.ts";
import { createApp } from "./app.ts";
import { openDatabase, prepareSchema } from "./database.ts";

export async function start(env: NodeJS.ProcessEnv = process.env) {
  const port = Number(env.PORT ?? 3000);
  if (!Number.isInteger(port) || port < 0 || port > 65535)
    throw new Error(`PORT must be a port number, got ${env.PORT}`);
  const { db, embedded, where } = await openDatabase({
    url: env.DATABASE_URL || undefined,
    dataDir: env.IDEM_DATA_DIR,
    poolSize: env.IDEM_POOL_SIZE ? Number(env.IDEM_POOL_SIZE) : undefined,
  });
  await prepareSchema(db);
  const demo = embedded || env.IDEM_DEMO === "1";
  if (demo) await ensureDemoAccounts(db);
  const retentionHours = Number(env.IDEM_RETENTION_HOURS ?? 24);
  const store = await PostgresStore.open(db, { retentionMs: retentionHours * 3_600_000 });
  const app = createApp({
    db,
    store,
    apiKeys: new ApiKeys(db),
    // IDEM_OPTIONAL_KEY=1 lets POSTs without a key through (the benchmark's baseline); never in production.
    requireKey: env.IDEM_OPTIONAL_KEY !== "1",
  });
  const server = serve({ fetch: app.fetch, port, hostname: env.HOST ?? "127.0.0.1" });
  await new Promise<void>((resolve) => server.once("listening", () => resolve()));
  const address = server.address();
  const actualPort = typeof address === "object" && address ? address.port : port;
  console.log(
    `idem payments service on http://${env.HOST ?? "127.0.0.1"}:${actualPort} (database: ${where})`,
  );
  if (demo) {
    for (const a of DEMO_ACCOUNTS) console.log(`  demo account ${a.id}: Authorization: Bearer ${a.apiKey}`);
  }
  const sweep = setInterval(() => store.sweep().catch((e) => console.error("sweep failed:", e)), 3_600_000);
  sweep.unref();
  const stop = async () => {
    clearInterval(sweep);
    await new Promise<void>((resolve) => server.close(() => resolve()));
    await db.close();
  };
  return { port: actualPort, stop, server };
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
