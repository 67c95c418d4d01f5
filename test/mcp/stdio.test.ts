/**
 * The reference service's MCP tools over stdio, as MCP clients run local servers: one process per
 * connection, started through the CLI (`payments mcp --api-key`), driven by the SDK's own client and
 * idem's agent helper, on the real PostgreSQL with the provider simulator. A reply lost after the
 * charge (a proxy between the two cuts it), then the retry through a new process: one charge, the same
 * result. The server killed in the middle of the provider call (phases mode): the retry through a new
 * process waits out the dead worker's lease, takes the key over and completes it: one charge.
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { idempotencyMetaOf, idempotentToolCalls } from "../../src/mcp/index.ts";
import { type Provider, startProvider } from "../../src/testing/provider.ts";
import { KEY_1 } from "../app/service.ts";
import { DATABASE_URL, freshDatabase, sayWhySkippedWithoutServer } from "../helpers/db.ts";
import { answered } from "./harness.ts";

sayWhySkippedWithoutServer();

const SERVER = [
  process.execPath,
  "--conditions=source",
  "--import",
  "tsx",
  "app/cli.ts",
  "mcp",
  "--api-key",
  KEY_1,
];

describe.skipIf(!DATABASE_URL)("the payments MCP server over stdio", () => {
  let db: { url: string; drop(): Promise<void> };
  let provider: Provider;
  let dir: string;
  beforeAll(async () => {
    db = await freshDatabase();
    provider = await startProvider();
    dir = mkdtempSync(join(tmpdir(), "idem-mcp-stdio-"));
  });
  afterAll(async () => {
    await provider?.close();
    await db?.drop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  /** A connected client of a new server process (through the drop proxy when `marker` is given). */
  function connector(options: { marker?: string; dropKey?: string; onPid?: (pid: number) => void } = {}) {
    return async () => {
      const [command, ...args] = options.marker
        ? [process.execPath, "test/mcp/fixtures/stdio-drop-proxy.mjs", options.marker, ...SERVER]
        : SERVER;
      const transport = new StdioClientTransport({
        command: command!,
        args,
        cwd: process.cwd(),
        stderr: "ignore",
        env: {
          ...(process.env as Record<string, string>),
          DATABASE_URL: db.url,
          PROVIDER_URL: provider.url,
          IDEM_DEMO: "1", // the demo accounts, whose API key the server is started with
          DROP_KEY: options.dropKey ?? "",
        },
      });
      const client = new Client({ name: "test-agent", version: "1.0.0" });
      await client.connect(transport);
      if (transport.pid !== null) options.onPid?.(transport.pid);
      return client;
    };
  }
  const chargesFor = (amount: number) => provider.charges().filter((c) => c.amount === amount);

  it("a reply lost after the charge, then the retry through a new process: one charge, the same result", async () => {
    const marker = join(dir, "dropped.json");
    const probe = idempotentToolCalls({ connect: connector() });
    const { key } = await probe.begin("stdio-order-1");
    const calls = idempotentToolCalls({
      connect: connector({ marker, dropKey: key }),
      store: probe.store,
      backoff: { baseMs: 50 },
    });
    const args = { amount_cents: 5101, currency: "eur", card: "4242424242424242" };
    const result = await calls.callTool(
      { name: "create_payment", arguments: args },
      { intent: "stdio-order-1" },
    );
    await calls.close();

    const lost = (JSON.parse(readFileSync(marker, "utf8")) as { result: CallToolResult }).result;
    expect(idempotencyMetaOf(lost)).toMatchObject({ key, replayed: false });
    expect(idempotencyMetaOf(result)).toMatchObject({ key, replayed: true });
    expect(answered(result)).toEqual(answered(lost));
    expect(chargesFor(5101)).toHaveLength(1);
    expect((await probe.store.get("stdio-order-1"))?.status).toBe("done");
  }, 90_000);

  it("the server killed mid-call in phases mode: one charge after the retry completes it", async () => {
    let pid: number | undefined;
    const calls = idempotentToolCalls({
      connect: connector({ onPid: (p) => (pid = p) }),
      deadlineMs: 75_000,
      backoff: { baseMs: 50 },
    });
    // The provider charges, then holds its reply: the server is killed while it waits for it.
    provider.failNext("late");
    const args = { amount_cents: 5102, currency: "eur" };
    const call = calls.callTool({ name: "create_payment", arguments: args }, { intent: "stdio-order-2" });
    const killed = (async () => {
      while (chargesFor(5102).length === 0) await new Promise((r) => setTimeout(r, 25));
      process.kill(pid!, "SIGKILL");
    })();
    const [result] = await Promise.all([call, killed]);
    await calls.close();

    expect(result.isError).toBeUndefined();
    const charge = chargesFor(5102);
    expect(charge).toHaveLength(1);
    expect((result.structuredContent as { charge: string }).charge).toBe(charge[0]!.id);
    const record = await calls.store.get("stdio-order-2");
    expect(record?.status).toBe("done");
    expect(record!.attempts).toBeGreaterThanOrEqual(2);
  }, 120_000);

  it("refuses to start with an API key it does not know", async () => {
    const client = new Client({ name: "test-agent", version: "1.0.0" });
    const transport = new StdioClientTransport({
      command: SERVER[0]!,
      args: [...SERVER.slice(1, -1), "sk_nobody"],
      cwd: process.cwd(),
      stderr: "pipe",
      env: { ...(process.env as Record<string, string>), DATABASE_URL: db.url, PROVIDER_URL: provider.url },
    });
    let err = "";
    transport.stderr?.on("data", (d) => {
      err += d;
    });
    await expect(client.connect(transport)).rejects.toThrow();
    await new Promise((r) => setTimeout(r, 200));
    expect(err).toContain("no such API key");
  }, 60_000);
});
