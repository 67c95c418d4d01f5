/**
 * `POST /mcp`: the payments tools (app/mcp.ts) over MCP's Streamable HTTP transport, stateless: each
 * request is authenticated with its API key (`Authorization: Bearer`, as the REST routes) and served by
 * a server and transport of its own, so any instance can answer any request and a retry after a lost
 * connection needs no session. The API key's account is the scope of the call's idempotency key.
 */
import { WebStandardStreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js";
import { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import type { ApiKeys } from "./accounts.ts";
import { type PaymentsMcpOptions, paymentsMcp } from "./mcp.ts";
import { auth, type Json, jsonBody, jsonReply, ref } from "./openapi-parts.ts";
import { authenticate, bearerOf } from "./payments.ts";
import { problem } from "./problems.ts";

/** The largest JSON-RPC message read (a tool call with its arguments). */
const MAX_MCP_BYTES = 64 * 1024;

type Env = { Variables: { accountId: string } };

export function mcpRoutes(deps: PaymentsMcpOptions & { apiKeys: ApiKeys }): Hono<Env> {
  const mcp = paymentsMcp(deps);
  const app = new Hono<Env>();
  app.post(
    "/mcp",
    bodyLimit({
      maxSize: MAX_MCP_BYTES,
      onError: () => problem(413, "body-too-large", `The body is larger than ${MAX_MCP_BYTES} bytes.`),
    }),
    authenticate(deps.apiKeys),
    async (c) => {
      const server = mcp.server();
      const transport = new WebStandardStreamableHTTPServerTransport({
        sessionIdGenerator: undefined, // stateless
        enableJsonResponse: true,
      });
      await server.connect(transport);
      try {
        return await transport.handleRequest(c.req.raw, {
          authInfo: { token: bearerOf(c) ?? "", clientId: c.var.accountId, scopes: [] },
        });
      } finally {
        await server.close();
      }
    },
  );
  return app;
}

/** `POST /mcp` in the OpenAPI document (app/openapi.ts): a JSON-RPC endpoint, its keys in the body. */
export function mcpPaths(): Json {
  return {
    "/mcp": {
      post: {
        operationId: "mcp",
        summary: "The payments API as MCP tools (Streamable HTTP, stateless): for AI agents",
        description:
          "JSON-RPC 2.0 messages of the Model Context Protocol: `initialize`, `tools/list`, `tools/call` " +
          "(`create_payment`, `list_payments`, `get_payment`). A `create_payment` call carries its " +
          "idempotency key in `params._meta.idempotencyKey` (or the `idempotency_key` argument); its " +
          "result's `_meta.idempotency` says whether it is a replay. See docs/mcp.md.",
        tags: ["payments"],
        security: auth,
        requestBody: jsonBody({ type: "object", description: "A JSON-RPC request or notification." }),
        responses: {
          "200": jsonReply("The JSON-RPC response.", { type: "object" }),
          "202": { description: "A notification or response was accepted." },
          "401": ref("responses", "Unauthorized"),
          "413": ref("responses", "BodyTooLarge"),
        },
        "x-idempotency": {
          required: false,
          retentionSeconds: null,
          replayHeader: null,
          answerWithinSeconds: null,
        },
      },
    },
  };
}
