// An agent loop against the reference service's MCP tools (Streamable HTTP at /mcp). The "model" here is
// a script standing in for an LLM: it reads the conversation and asks for tool calls, as a model's API
// answers with tool_use blocks. What matters is around it: each tool call the model intends gets ONE
// idempotency key, kept in a file with the call, so that a retry, a reconnect or a restart of this
// agent never charges twice.
//
//   npm start                                              (the service, with its demo accounts)
//   npx tsx --conditions=source examples/mcp-agent.ts      (MCP_URL, API_KEY, INTENTS_DIR to change)
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { FileIntentStore } from "idem/client/file";
import { idempotencyMetaOf, idempotentToolCalls } from "idem/mcp";

const url = new URL(process.env.MCP_URL ?? "http://127.0.0.1:3000/mcp");
const apiKey = process.env.API_KEY ?? "sk_test_demo_1";

type Message =
  | { role: "user" | "assistant"; text: string }
  | { role: "tool_use"; id: string; name: string; input: Record<string, unknown> }
  | { role: "tool_result"; id: string; result: CallToolResult };

/** The stand-in model: pays once for the order, then lists the payments, then answers. */
function model(messages: Message[], order: string): Message[] {
  const results = messages.filter((m) => m.role === "tool_result");
  if (results.length === 0) {
    // A model's tool_use id names this one intended call: the agent keys the call by it.
    return [
      {
        role: "tool_use",
        id: `${order}-pay`,
        name: "create_payment",
        input: { amount_cents: 4200, currency: "eur" },
      },
    ];
  }
  if (results.length === 1)
    return [{ role: "tool_use", id: `${order}-list`, name: "list_payments", input: {} }];
  const paid = results[0]!.result.structuredContent as { id?: string } | undefined;
  const listed = results[1]!.result.structuredContent as { data?: unknown[] } | undefined;
  return [
    { role: "assistant", text: `Paid ${paid?.id}; your account shows ${listed?.data?.length} payment(s).` },
  ];
}

const client = async () => {
  const c = new Client({ name: "example-agent", version: "1.0.0" });
  await c.connect(
    new StreamableHTTPClientTransport(url, {
      requestInit: { headers: { authorization: `Bearer ${apiKey}` } },
    }),
  );
  return c;
};
const calls = idempotentToolCalls({
  connect: client,
  store: new FileIntentStore({ dir: process.env.INTENTS_DIR ?? ".idem/agent-intents" }),
});

// A restarted agent first finishes what it had begun: the same calls, with the same keys.
for (const intent of await calls.pending()) {
  const r = await calls.resume(intent.id);
  console.log(`resumed ${intent.id}: replayed=${idempotencyMetaOf(r)?.replayed}`);
}

// Which tools change something: the server publishes it in tools/list (`_meta.idempotency`).
const lister = await client();
const keyed = new Set(
  (await lister.listTools()).tools.filter((t) => t._meta?.idempotency).map((t) => t.name),
);

const order = process.env.ORDER ?? `order-${crypto.randomUUID().slice(0, 8)}`;
const messages: Message[] = [{ role: "user", text: `Pay 42.00 EUR for ${order}, then show my payments.` }];
for (let turn = 0; turn < 8; turn++) {
  const next = model(messages, order);
  messages.push(...next);
  const uses = next.filter((m) => m.role === "tool_use");
  if (uses.length === 0) break;
  for (const use of uses) {
    const result = keyed.has(use.name)
      ? await calls.callTool({ name: use.name, arguments: use.input }, { intent: use.id })
      : ((await lister.callTool({ name: use.name, arguments: use.input })) as CallToolResult);
    const meta = idempotencyMetaOf(result);
    console.log(
      `${use.name}: ${result.isError ? "error" : "ok"}${meta ? ` key=${meta.key} replayed=${meta.replayed}` : ""}`,
    );
    messages.push({ role: "tool_result", id: use.id, result });
  }
}
const last = messages.at(-1);
console.log(last?.role === "assistant" ? last.text : "the model did not finish");
await lister.close();
await calls.close();
