/** An `McpServer` and the SDK's own `Client`, linked in memory, for tests of idem/mcp's tools. */
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";

/** A server made by `setup`, and a connected client; `close()` ends both. */
export async function linked(
  setup: (server: McpServer) => void,
  options: { authInfo?: { clientId: string; token: string } } = {},
): Promise<{ client: Client; server: McpServer; close(): Promise<void> }> {
  const server = new McpServer({ name: "test", version: "1.0.0" });
  setup(server);
  const [serverSide, clientSide] = InMemoryTransport.createLinkedPair();
  await server.connect(serverSide);
  if (options.authInfo) {
    // The in-memory transport hands `authInfo` to the server with each message, as HTTP transports do.
    const auth = { ...options.authInfo, scopes: [] };
    const send = clientSide.send.bind(clientSide);
    clientSide.send = (message, opts) => send(message, { ...opts, authInfo: auth });
  }
  const client = new Client({ name: "test-client", version: "1.0.0" });
  await client.connect(clientSide);
  return {
    client,
    server,
    async close() {
      await client.close();
      await server.close();
    },
  };
}

/** A tool call's result, typed. */
export async function call(
  client: Client,
  name: string,
  args: Record<string, unknown>,
  key?: string,
): Promise<CallToolResult> {
  return (await client.callTool({
    name,
    arguments: args,
    ...(key !== undefined && { _meta: { idempotencyKey: key } }),
  })) as CallToolResult;
}

/** The result without idem's `_meta.idempotency` (what the tool itself answered). */
export function answered(result: CallToolResult): CallToolResult {
  const { _meta, ...rest } = result;
  if (!_meta) return rest;
  const { idempotency: _, ...meta } = _meta;
  return Object.keys(meta).length ? { ...rest, _meta: meta } : rest;
}
