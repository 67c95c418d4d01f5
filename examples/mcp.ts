// An MCP tool that charges once, in one file: an McpServer whose `pay` tool is keyed by idem/mcp, served
// over Streamable HTTP on the embedded PGlite, and an agent whose first reply is lost after the charge.
// Run it: npx tsx --conditions=source examples/mcp.ts
import { PGlite } from "@electric-sql/pglite";
import { serve } from "@hono/node-server";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { WebStandardStreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js";
import { Hono } from "hono";
import { idempotencyMetaOf, idempotentToolCalls, idempotentTools } from "idem/mcp";
import { fromPglite, migrate, PostgresStore, type Tx } from "idem/postgres";
import { z } from "zod";

const db = fromPglite(await PGlite.create());
await migrate(db);
await db.exec("CREATE TABLE charges (id serial PRIMARY KEY, account text, amount_cents int)");
const store = await PostgresStore.open(db);

/** The server: one `McpServer` per request (stateless Streamable HTTP), the caller from its API key. */
function mcpServer(): McpServer {
  const server = new McpServer({ name: "shop", version: "1.0.0" });
  const tools = idempotentTools<Tx>(server, {
    store,
    scope: (extra) => extra.authInfo?.clientId, // the authenticated account, never the JSON-RPC id
  });
  tools.registerTool(
    "pay",
    {
      description: "Charge the account once. Reuse the same idempotency key when you retry a payment.",
      inputSchema: { amount_cents: z.number().int().positive() },
    },
    async ({ amount_cents }, { tx, scope }) => {
      // In the key's transaction: the charge and the saved result commit together, or neither does.
      const { rows } = await tx.query<{ id: number }>(
        "INSERT INTO charges (account, amount_cents) VALUES ($1, $2) RETURNING id",
        [scope, amount_cents],
      );
      return { content: [{ type: "text", text: `charge ${rows[0]!.id}` }], structuredContent: rows[0]! };
    },
  );
  return server;
}

const app = new Hono();
app.post("/mcp", async (c) => {
  const account = c.req.header("authorization") === "Bearer sk_demo" ? "acct_1" : undefined;
  if (!account) return c.json({ error: "unauthorized" }, 401);
  const server = mcpServer();
  const transport = new WebStandardStreamableHTTPServerTransport({ enableJsonResponse: true });
  await server.connect(transport);
  try {
    return await transport.handleRequest(c.req.raw, {
      authInfo: { token: "sk_demo", clientId: account, scopes: [] },
    });
  } finally {
    await server.close();
  }
});

const http = serve({ fetch: app.fetch, port: 0 }, async ({ port }) => {
  // The agent side. A network that loses the first reply to a tool call, after the server answered it:
  let lost = 0;
  const flaky: typeof fetch = async (input, init) => {
    const response = await fetch(input, init);
    if (String(init?.body).includes('"tools/call"') && lost === 0) {
      lost++;
      await response.arrayBuffer(); // the server did the work and answered; the reply never arrives
      throw new TypeError("fetch failed (the connection was reset)");
    }
    return response;
  };
  const calls = idempotentToolCalls({
    connect: async () => {
      const client = new Client({ name: "agent", version: "1.0.0" });
      const url = new URL(`http://127.0.0.1:${port}/mcp`);
      const headers = { authorization: "Bearer sk_demo" };
      await client.connect(
        new StreamableHTTPClientTransport(url, { fetch: flaky, requestInit: { headers } }),
      );
      return client;
    },
  });
  // One intended payment, one key (made now, stored with the intent, sent with every attempt).
  const result = await calls.callTool(
    { name: "pay", arguments: { amount_cents: 5000 } },
    { intent: "order-42" },
  );
  const meta = idempotencyMetaOf(result);
  console.log(
    `lost replies: ${lost}, result: ${JSON.stringify(result.structuredContent)} replayed=${meta?.replayed}`,
  );
  const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM charges");
  console.log(`charges in the table: ${rows[0]!.n}`);
  if (rows[0]!.n !== 1 || meta?.replayed !== true) process.exitCode = 1;
  await calls.close();
  http.close();
  await db.close();
});
