/**
 * The reference service's MCP tools over Streamable HTTP (`POST /mcp`), driven by the SDK's own client,
 * on the real PostgreSQL with the provider simulator: a reply cut by a proxy after the charge, then the
 * retry (one charge, the same result); 50 concurrent calls with one key (one charge); another
 * account's key never replayed to this one.
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { idempotencyMetaOf, idempotentToolCalls } from "../../src/mcp/index.ts";
import { type FaultProxy, startFaultProxy } from "../../src/testing/verify/proxy.ts";
import { KEY_1, KEY_2, type RunningService, startService } from "../app/service.ts";
import { sayWhySkippedWithoutServer, serverBackends } from "../helpers/db.ts";
import { answered } from "./harness.ts";

sayWhySkippedWithoutServer();

/** An MCP tool call's key, read from its JSON-RPC body (what the proxy drops replies by). */
function mcpKey(_headers: unknown, body: Buffer): string | undefined {
  const message = JSON.parse(body.toString("utf8")) as { params?: { _meta?: { idempotencyKey?: string } } };
  return message.params?._meta?.idempotencyKey;
}

async function connect(url: string, apiKey: string): Promise<Client> {
  const client = new Client({ name: "test-agent", version: "1.0.0" });
  await client.connect(
    new StreamableHTTPClientTransport(new URL(`${url}/mcp`), {
      requestInit: { headers: { authorization: `Bearer ${apiKey}` } },
    }),
  );
  return client;
}

const PAYMENT = { amount_cents: 4200, currency: "eur", card: "4242424242424242" };

describe.each(serverBackends)("the payments MCP server over Streamable HTTP on $name", (backend) => {
  let svc: RunningService;
  let proxy: FaultProxy;
  beforeAll(async () => {
    svc = await startService(backend, { paymentsMode: "phases" });
    proxy = await startFaultProxy({ target: svc.url, keyOf: mcpKey });
  });
  afterAll(async () => {
    await proxy?.close();
    await svc?.stop();
  });
  const chargesFor = (amount: number) => svc.provider!.charges().filter((c) => c.amount === amount).length;

  it("a reply cut after the charge, then the retry: one charge, the same result", async () => {
    const calls = idempotentToolCalls({ connect: () => connect(proxy.url, KEY_1), backoff: { baseMs: 20 } });
    const intent = `order-${crypto.randomUUID()}`;
    const args = { ...PAYMENT, amount_cents: 4301 };
    // The intent's key is made and stored when it begins; the proxy cuts the first reply with that key.
    const { key } = await calls.begin(intent);
    proxy.inject(key, "drop");
    const result = await calls.callTool({ name: "create_payment", arguments: args }, { intent });
    await calls.close();

    const exchanges = proxy.exchanges(key);
    expect(exchanges.map((e) => e.fate)).toEqual(["dropped", "relayed"]);
    const cut = (JSON.parse(exchanges[0]!.body) as { result: CallToolResult }).result;
    expect(idempotencyMetaOf(cut)).toMatchObject({ key, replayed: false });
    expect(idempotencyMetaOf(result)).toMatchObject({ key, replayed: true });
    expect(answered(result)).toEqual(answered(cut)); // the same CallToolResult the cut reply carried
    expect(chargesFor(4301)).toBe(1);
    expect(await svc.count("SELECT count(*)::int AS n FROM payments WHERE amount_cents = 4301")).toBe(1);
  });

  it("50 concurrent calls with one key: one charge, one payment, one result", async () => {
    const client = await connect(svc.url, KEY_1);
    try {
      const key = crypto.randomUUID();
      const args = { ...PAYMENT, amount_cents: 4302 };
      const results = (await Promise.all(
        Array.from({ length: 50 }, () =>
          client.callTool({ name: "create_payment", arguments: args, _meta: { idempotencyKey: key } }),
        ),
      )) as CallToolResult[];
      const answers = results.filter((r) => !r.isError);
      const inProgress = results.filter((r) => idempotencyMetaOf(r)?.code === "idempotency-key-in-flight");
      expect(answers.length + inProgress.length).toBe(50);
      expect(answers.length).toBeGreaterThanOrEqual(1);
      expect(answers.filter((r) => idempotencyMetaOf(r)?.replayed === false).length).toBeLessThanOrEqual(1);
      for (const r of answers) expect(answered(r)).toEqual(answered(answers[0]!));
      const after = (await client.callTool({
        name: "create_payment",
        arguments: args,
        _meta: { idempotencyKey: key },
      })) as CallToolResult;
      expect(answered(after)).toEqual(answered(answers[0]!));
      expect(chargesFor(4302)).toBe(1);
      expect(await svc.count("SELECT count(*)::int AS n FROM payments WHERE amount_cents = 4302")).toBe(1);
    } finally {
      await client.close();
    }
  });

  it("another account's key never replays to this one", async () => {
    const a = await connect(svc.url, KEY_1);
    const b = await connect(svc.url, KEY_2);
    try {
      const key = crypto.randomUUID();
      const args = { ...PAYMENT, amount_cents: 4303 };
      const call = (c: Client) =>
        c.callTool({
          name: "create_payment",
          arguments: args,
          _meta: { idempotencyKey: key },
        }) as Promise<CallToolResult>;
      const ra = await call(a);
      const rb = await call(b);
      expect(idempotencyMetaOf(rb)).toMatchObject({ replayed: false });
      expect((rb.structuredContent as { id: string }).id).not.toBe(
        (ra.structuredContent as { id: string }).id,
      );
      expect(chargesFor(4303)).toBe(2);
      const listed = (await b.callTool({ name: "list_payments", arguments: {} })) as CallToolResult;
      const ids = (listed.structuredContent as { data: Array<{ id: string }> }).data.map((p) => p.id);
      expect(ids).toContain((rb.structuredContent as { id: string }).id);
      expect(ids).not.toContain((ra.structuredContent as { id: string }).id);
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("refuses /mcp without an API key", async () => {
    const r = await fetch(`${svc.url}/mcp`, {
      method: "POST",
      headers: { "content-type": "application/json", accept: "application/json, text/event-stream" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list" }),
    });
    expect(r.status).toBe(401);
  });
});

describe.each(serverBackends)("the payments MCP server in atomic mode on $name", (backend) => {
  let svc: RunningService;
  beforeAll(async () => {
    svc = await startService(backend, { paymentsMode: "atomic" });
  });
  afterAll(async () => {
    await svc?.stop();
  });

  it("50 concurrent calls with one key: one payment row", async () => {
    const client = await connect(svc.url, KEY_1);
    try {
      const key = crypto.randomUUID();
      const args = { amount_cents: 4304, currency: "eur" };
      const results = (await Promise.all(
        Array.from({ length: 50 }, () =>
          client.callTool({ name: "create_payment", arguments: args, _meta: { idempotencyKey: key } }),
        ),
      )) as CallToolResult[];
      const answers = results.filter((r) => !r.isError);
      expect(answers.length).toBeGreaterThanOrEqual(1);
      for (const r of results.filter((x) => x.isError)) {
        expect(idempotencyMetaOf(r)?.code).toBe("idempotency-key-in-flight");
      }
      for (const r of answers) expect(answered(r)).toEqual(answered(answers[0]!));
      expect(await svc.count("SELECT count(*)::int AS n FROM payments WHERE amount_cents = 4304")).toBe(1);
    } finally {
      await client.close();
    }
  });
});
