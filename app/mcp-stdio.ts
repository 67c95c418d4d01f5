/**
 * `npm run -s payments -- mcp --api-key KEY`: the payments tools (app/mcp.ts) over stdio, the way MCP
 * clients start local servers (one process per connection, JSON-RPC on stdin/stdout; nothing else is
 * written to stdout). The caller is the account of the API key given at start (or IDEM_API_KEY); its
 * keys live in the service's database (DATABASE_URL), so a call retried through a new process, after
 * a reconnect or a crash, finds its key and is answered from it.
 *
 * In phases mode the provider is PROVIDER_URL, else the simulator of a running service (PROVIDER_PORT,
 * default 4100): a process of its own, since a simulator inside this process would forget its charges
 * with every reconnect.
 */
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { PostgresStore } from "idem/postgres";
import { ApiKeys, ensureDemoAccounts } from "./accounts.ts";
import { type Env, loadConfig, providerUrlOf } from "./config.ts";
import { ensureSchema, openDatabase } from "./database.ts";
import { paymentsMcp } from "./mcp.ts";

/** Serve the tools on stdin/stdout until the client closes them (or a signal); the exit code. */
export async function serveMcpStdio(env: Env, apiKey: string): Promise<number> {
  const config = loadConfig(env);
  const { db, embedded } = await openDatabase(config.database);
  try {
    await ensureSchema(db);
    if (embedded || config.demo) await ensureDemoAccounts(db);
    const store = await PostgresStore.open(db, { retentionMs: config.retentionMs, sealer: config.sealer });
    const apiKeys = new ApiKeys(db);
    const account = await apiKeys.accountForUncached(apiKey);
    if (!account) {
      console.error("idem-payments: no such API key (revoked, or mistyped): the MCP server did not start");
      return 1;
    }
    const server = paymentsMcp({
      store,
      apiKeys,
      paymentsMode: config.paymentsMode,
      providerUrl: providerUrlOf(config),
      providerIdempotency: config.provider.idempotency,
      cardTokenKey: config.cardTokenKey,
    }).server({ account, apiKey });
    const closed = new Promise<void>((resolve) => {
      server.server.onclose = () => resolve();
      process.stdin.once("end", () => resolve());
      for (const sig of ["SIGINT", "SIGTERM"] as const) process.once(sig, () => resolve());
    });
    await server.connect(new StdioServerTransport());
    console.error(
      `idem-payments: MCP tools on stdio for account ${account} (database: ${embedded ? "embedded" : "server"})`,
    );
    await closed;
    await server.close();
    await store.retire().catch(() => {});
    return 0;
  } finally {
    await db.close();
  }
}
