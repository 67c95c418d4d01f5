/**
 * The agent side (`idempotentToolCalls`): one key per intended call, reused when the connection drops
 * after the effect (a new client is connected), when the server says the call is still in progress,
 * and after the agent restarts (a store that outlives it); refused for other arguments; uncertain
 * operations left to a person.
 */
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { McpError } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod/v4";
import { IntentStatus, MemoryIntentStore } from "../../src/client/intent-store.ts";
import { OperationUncertainError } from "../../src/core/index.ts";
import { idempotencyMetaOf, idempotentToolCalls, type ToolCaller } from "../../src/mcp/index.ts";
import { idempotentTools } from "../../src/mcp/server.ts";
import type { Tx } from "../../src/postgres/db.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { backends, type OpenDb } from "../helpers/db.ts";
import { latch } from "../helpers/latch.ts";
import { answered, linked } from "./harness.ts";

const backend = backends[0]!; // the helper's logic; the real server is exercised end to end in service tests

describe("idempotentToolCalls", () => {
  let open: OpenDb;
  let store: PostgresStore;
  let runs = 0;
  let hold: Promise<void> | undefined;
  const keys: string[] = [];
  const clients: Array<{ close(): Promise<void> }> = [];

  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
    await open.db.query("CREATE TABLE orders (id serial PRIMARY KEY, item text)");
    store = await PostgresStore.open(open.db, { lockTimeoutMs: 300 });
  });
  afterAll(async () => {
    for (const c of clients) await c.close().catch(() => {});
    await open?.close();
  });

  /** A connected client of a fresh server (what `connect` does after each reconnect). */
  async function connect(): Promise<Client> {
    const l = await linked((server) => {
      const t = idempotentTools<Tx>(server, { store, scope: () => "agent_1" });
      t.registerTool("order", { inputSchema: { item: z.string() } }, async (args, { tx, key }) => {
        runs++;
        keys.push(key!);
        if (hold) await hold;
        const { rows } = await tx.query<{ id: number }>(
          "INSERT INTO orders (item) VALUES ($1) RETURNING id",
          [args.item],
        );
        return { content: [{ type: "text", text: `order ${rows[0]!.id}` }] };
      });
    });
    clients.push(l);
    return l.client;
  }

  /** A client whose first `n` calls are sent but their replies lost (the connection closes after the effect). */
  function losingReplies(n: number): () => Promise<ToolCaller> {
    let lost = 0;
    return async () => {
      const client = await connect();
      return {
        async callTool(params, schema, options) {
          const result = await client.callTool(params, schema, options);
          if (lost++ < n) throw new McpError(-32000, "Connection closed");
          return result;
        },
        close: () => client.close(),
      };
    };
  }

  it("sends one key through lost replies and reconnects: one order, the first result", async () => {
    let connects = 0;
    const base = losingReplies(2);
    const calls = idempotentToolCalls({
      connect: () => {
        connects++;
        return base();
      },
      backoff: { baseMs: 5, capMs: 20 },
    });
    const before = runs;
    keys.length = 0;
    const result = await calls.callTool({ name: "order", arguments: { item: "lamp" } });
    expect(runs - before).toBe(1);
    expect(connects).toBe(3);
    expect(idempotencyMetaOf(result)).toMatchObject({ replayed: true });
    expect((result.content[0] as { text: string }).text).toMatch(/^order \d+$/);
    const { rows } = await open.db.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM orders WHERE item = 'lamp'",
    );
    expect(rows[0]!.n).toBe(1);
    expect(await calls.pending()).toEqual([]); // an unnamed intent is gone once answered
    await calls.close();
  });

  it("waits out 'in progress' answers with the same key", async () => {
    const [gate, release] = latch();
    hold = gate;
    const a = idempotentToolCalls({ connect });
    const b = idempotentToolCalls({ connect, store: a.store });
    try {
      const before = runs;
      const first = a.callTool({ name: "order", arguments: { item: "desk" } }, { intent: "desk-1" });
      while (runs === before) await new Promise((r) => setTimeout(r, 10));
      // The same intent from a second agent instance (same store): the same key, "in progress" until done.
      const second = b.callTool({ name: "order", arguments: { item: "desk" } }, { intent: "desk-1" });
      setTimeout(release, 1_200);
      const [r1, r2] = await Promise.all([first, second]);
      expect(runs - before).toBe(1);
      expect(answered(r2)).toEqual(answered(r1));
      const record = await a.store.get("desk-1");
      expect(record).toMatchObject({ status: IntentStatus.done, outcome: { status: 200 } });
      expect(record!.attempts).toBeGreaterThanOrEqual(3);
    } finally {
      hold = undefined;
      release();
      await a.close();
      await b.close();
    }
  });

  it("after a restart, resumes a pending intent with its key", async () => {
    const intents = new MemoryIntentStore(); // stands for a file or PostgreSQL store
    const crashed = idempotentToolCalls({ connect: losingReplies(100), store: intents, maxAttempts: 1 });
    const before = runs;
    keys.length = 0;
    await expect(
      crashed.callTool({ name: "order", arguments: { item: "chair" } }, { intent: "chair-1" }),
    ).rejects.toMatchObject({ name: "AttemptsExhaustedError" });
    const [pending] = await crashed.pending();
    expect(pending).toMatchObject({ id: "chair-1", status: IntentStatus.pending, attempts: 1 });

    const restarted = idempotentToolCalls({ connect, store: intents });
    const result = await restarted.resume("chair-1");
    expect(runs - before).toBe(1);
    expect(keys).toEqual([pending!.key]);
    expect(idempotencyMetaOf(result)).toMatchObject({ key: pending!.key, replayed: true });
    // Calling the named intent again sends its key again: replayed, not ordered twice.
    const again = await restarted.callTool(
      { name: "order", arguments: { item: "chair" } },
      { intent: "chair-1" },
    );
    expect(answered(again)).toEqual(answered(result));
    await expect(
      restarted.callTool({ name: "order", arguments: { item: "sofa" } }, { intent: "chair-1" }),
    ).rejects.toMatchObject({ name: "IntentConflictError" });
    expect(runs - before).toBe(1);
    await crashed.close();
    await restarted.close();
  });

  it("returns a refusal of the arguments as final, and leaves an uncertain operation to a person", async () => {
    const calls = idempotentToolCalls({ connect });
    // Arguments the tool's schema refuses: the SDK answers with a tool error before anything runs.
    const before = runs;
    const refused = await calls.callTool({ name: "order", arguments: { item: 42 } }, { intent: "bad-1" });
    expect(refused.isError).toBe(true);
    expect((refused.content[0] as { text: string }).text).toMatch(/Input validation error/);
    expect(runs).toBe(before);
    expect(await calls.store.get("bad-1")).toMatchObject({ status: IntentStatus.done });

    // A server that answers "uncertain" (a phases key in review) is not retried, with either key.
    const uncertain = idempotentToolCalls({
      connect: async () => ({
        callTool: async () => ({
          isError: true,
          content: [{ type: "text", text: "outcome unknown" }],
          _meta: {
            idempotency: {
              key: "k",
              replayed: false,
              status: 409,
              operationState: "uncertain",
              operationRef: "op_x",
            },
          },
        }),
        close: async () => {},
      }),
    });
    const err = await uncertain
      .callTool({ name: "order", arguments: { item: "vase" } }, { intent: "vase-1" })
      .catch((e) => e);
    expect(err.name).toBe("OperationUncertainError");
    expect(err).not.toBeInstanceOf(OperationUncertainError); // the client's error, not the server's
    expect(err.operationRef).toBe("op_x");
    expect(await uncertain.store.get("vase-1")).toMatchObject({ status: IntentStatus.uncertain });
    await expect(
      uncertain.callTool({ name: "order", arguments: { item: "vase" } }, { intent: "vase-1" }),
    ).rejects.toMatchObject({ name: "OperationUncertainError" });
    await calls.close();
  });

  it("gives up at the deadline, leaving the intent pending", async () => {
    const calls = idempotentToolCalls({
      connect: async () => {
        throw Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:1"), { code: "ECONNREFUSED" });
      },
      deadlineMs: 300,
      backoff: { baseMs: 50, capMs: 100 },
    });
    const err = await calls
      .callTool({ name: "order", arguments: { item: "rug" } }, { intent: "rug-1" })
      .catch((e) => e);
    expect(err.name).toBe("DeadlineExceededError");
    expect(err.attempts).toBeGreaterThanOrEqual(2);
    expect(await calls.store.get("rug-1")).toMatchObject({ status: IntentStatus.pending });
  });
});
