/**
 * idem/mcp's server side, driven by the SDK's own client (in memory) against every store backend:
 * a keyed tool runs once and a retry gets the same result marked as a replay; another call's key is
 * refused (422's tool error), a key in use is "in progress" with when to ask again, another scope's
 * key is never replayed here; read-only tools pass through; phases tools run through a runner.
 */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as z3 from "zod/v3";
import { z } from "zod/v4";
import { IdemOptionsError, RetryableError } from "../../src/core/index.ts";
import { idempotencyMetaOf, idempotentTools, toolResponse } from "../../src/mcp/index.ts";
import type { Tx } from "../../src/postgres/db.ts";
import { definePhases, jsonResponse } from "../../src/postgres/phases/index.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { type Provider, startProvider } from "../../src/testing/provider.ts";
import { chargeProvider, listCharges } from "../../src/testing/provider-client.ts";
import { backends, type OpenDb, serverBackends } from "../helpers/db.ts";
import { latch } from "../helpers/latch.ts";
import { answered, call, linked } from "./harness.ts";

const text = (r: CallToolResult) => (r.content[0] as { text: string }).text;

describe.each(backends)("MCP tools on $name", (backend) => {
  let open: OpenDb;
  let store: PostgresStore;
  let provider: Provider;
  let runs = 0;
  const count = async (sql: string, params: unknown[] = []) =>
    Number((await open.db.query<{ n: number }>(sql, params)).rows[0]!.n);

  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
    await open.db.query("CREATE TABLE notes (id serial PRIMARY KEY, scope text, body text)");
    store = await PostgresStore.open(open.db, { lockTimeoutMs: 1_500 });
    provider = await startProvider({ declineAmounts: [402] });
  });
  afterAll(async () => {
    await provider?.close();
    await open?.close();
  });

  /** `add_note` (atomic), `fail_once` (throws, then answers), `count_notes` (read-only), `touch` (idempotentHint). */
  function tools(
    server: McpServer,
    scope = (extra: { authInfo?: { clientId: string } }) => extra.authInfo?.clientId,
  ) {
    const t = idempotentTools<Tx>(server, { store, scope, onError: () => {} });
    t.registerTool(
      "add_note",
      { description: "Add a note.", inputSchema: { body: z.string() } },
      async (args, { tx, scope: s }) => {
        runs++;
        const { rows } = await tx.query<{ id: number }>(
          "INSERT INTO notes (scope, body) VALUES ($1, $2) RETURNING id",
          [s, args.body],
        );
        if (args.body === "refused") return { isError: true, content: [{ type: "text", text: "refused" }] };
        return {
          content: [{ type: "text", text: `note ${rows[0]!.id}` }],
          structuredContent: { id: rows[0]!.id },
        };
      },
    );
    let failures = 0;
    t.registerTool("fail_once", { inputSchema: { body: z.string() } }, async (args, { tx, scope: s }) => {
      await tx.query("INSERT INTO notes (scope, body) VALUES ($1, $2)", [s, args.body]);
      if (failures++ === 0) throw new Error("the tool broke after its write");
      return { content: [{ type: "text", text: "written" }] };
    });
    t.registerTool("count_notes", { annotations: { readOnlyHint: true } }, async (_args, { tx, key }) => ({
      content: [
        { type: "text", text: String((await tx.query("SELECT count(*)::int AS n FROM notes")).rows[0]!.n) },
      ],
      structuredContent: { key: key ?? null },
    }));
    t.registerTool(
      "touch",
      { inputSchema: { body: z.string() }, annotations: { idempotentHint: true } },
      async (args, { key }) => {
        runs++;
        return { content: [{ type: "text", text: `${args.body} ${key ?? "no key"} ${runs}` }] };
      },
    );
    t.registerTool(
      "delete_notes",
      { inputSchema: { body: z.string() }, annotations: { idempotentHint: true, destructiveHint: true } },
      async (args, { tx }) => {
        const { rowCount } = await tx.query("DELETE FROM notes WHERE body = $1", [args.body]);
        return { content: [{ type: "text", text: `deleted ${rowCount}` }] };
      },
    );
    return t;
  }

  it("runs a keyed call once; the retry gets the same result, marked as a replay", async () => {
    const { client, close } = await linked(tools, { authInfo: { clientId: "acct_1", token: "t1" } });
    try {
      const key = crypto.randomUUID();
      const before = runs;
      const first = await call(client, "add_note", { body: "hello" }, key);
      const again = await call(client, "add_note", { body: "hello" }, key);
      // A client that cannot set _meta sends the key as the declared argument: the same call.
      const byArgument = await call(client, "add_note", { body: "hello", idempotency_key: key });
      expect(runs - before).toBe(1);
      expect(await count("SELECT count(*)::int AS n FROM notes WHERE body = 'hello'")).toBe(1);
      expect(first.isError).toBeUndefined();
      expect(answered(again)).toEqual(answered(first));
      expect(answered(byArgument)).toEqual(answered(first));
      expect(idempotencyMetaOf(first)).toMatchObject({ key, replayed: false });
      expect(idempotencyMetaOf(again)).toMatchObject({ key, replayed: true });
      expect(Date.parse(idempotencyMetaOf(again)!.expiresAt!)).toBeGreaterThan(Date.now());
    } finally {
      await close();
    }
  });

  it("refuses the key with other arguments (422's tool error) and runs nothing", async () => {
    const { client, close } = await linked(tools, { authInfo: { clientId: "acct_1", token: "t1" } });
    try {
      const key = crypto.randomUUID();
      await call(client, "add_note", { body: "first" }, key);
      const before = runs;
      const other = await call(client, "add_note", { body: "second" }, key);
      expect(runs).toBe(before);
      expect(other.isError).toBe(true);
      expect(text(other)).toMatch(/already used for a call with other arguments/);
      expect(idempotencyMetaOf(other)).toMatchObject({
        status: 422,
        code: "idempotency-key-mismatch",
        retrySameKey: false,
        replayed: false,
      });
      expect(await count("SELECT count(*)::int AS n FROM notes WHERE body = 'second'")).toBe(0);
    } finally {
      await close();
    }
  });

  it("refuses a side-effecting call without a key, saying how to send one", async () => {
    const { client, close } = await linked(tools, { authInfo: { clientId: "acct_1", token: "t1" } });
    try {
      const before = runs;
      const r = await call(client, "add_note", { body: "keyless" });
      expect(runs).toBe(before);
      expect(r.isError).toBe(true);
      expect(text(r)).toContain('"idempotency_key" argument or as _meta.idempotencyKey');
      expect(idempotencyMetaOf(r)).toMatchObject({ status: 400, code: "idempotency-key-missing" });
      const bad = await call(client, "add_note", { body: "bad" }, "a key with spaces");
      expect(idempotencyMetaOf(bad)).toMatchObject({ status: 400, code: "idempotency-key-invalid" });
      const twoKeys = await client.callTool({
        name: "add_note",
        arguments: { body: "two", idempotency_key: "k-a" },
        _meta: { idempotencyKey: "k-b" },
      });
      expect(idempotencyMetaOf(twoKeys as CallToolResult)).toMatchObject({ code: "idempotency-key-invalid" });
      expect(runs).toBe(before);
    } finally {
      await close();
    }
  });

  it("never replays another client's key to this one", async () => {
    const a = await linked(tools, { authInfo: { clientId: "acct_a", token: "ta" } });
    const b = await linked(tools, { authInfo: { clientId: "acct_b", token: "tb" } });
    try {
      const key = crypto.randomUUID();
      const ra = await call(a.client, "add_note", { body: "same words" }, key);
      const rb = await call(b.client, "add_note", { body: "same words" }, key);
      expect(idempotencyMetaOf(rb)).toMatchObject({ replayed: false });
      expect(rb.structuredContent).not.toEqual(ra.structuredContent);
      expect(
        await count("SELECT count(*)::int AS n FROM notes WHERE body = 'same words' AND scope = 'acct_b'"),
      ).toBe(1);
      expect(
        await count("SELECT count(*)::int AS n FROM notes WHERE body = 'same words' AND scope = 'acct_a'"),
      ).toBe(1);
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("refuses a keyed call with no client or session to keep the key under", async () => {
    const { client, close } = await linked((s) => tools(s, () => undefined));
    try {
      const r = await call(client, "add_note", { body: "anonymous" }, crypto.randomUUID());
      expect(idempotencyMetaOf(r)).toMatchObject({ status: 401, code: "unauthorized" });
      expect(await count("SELECT count(*)::int AS n FROM notes WHERE body = 'anonymous'")).toBe(0);
    } finally {
      await close();
    }
  });

  it("saves a returned tool error as the answer, and rolls back a thrown one for the retry", async () => {
    const { client, close } = await linked(tools, { authInfo: { clientId: "acct_1", token: "t1" } });
    try {
      const key = crypto.randomUUID();
      const refused = await call(client, "add_note", { body: "refused" }, key);
      const again = await call(client, "add_note", { body: "refused" }, key);
      expect(refused.isError).toBe(true);
      expect(answered(again)).toEqual(answered(refused));
      expect(idempotencyMetaOf(again)?.replayed).toBe(true);

      const k2 = crypto.randomUUID();
      const broke = await call(client, "fail_once", { body: "fragile" }, k2);
      expect(broke.isError).toBe(true);
      expect(idempotencyMetaOf(broke)).toMatchObject({ status: 500, retrySameKey: true });
      expect(await count("SELECT count(*)::int AS n FROM notes WHERE body = 'fragile'")).toBe(0);
      const retried = await call(client, "fail_once", { body: "fragile" }, k2);
      expect(text(retried)).toBe("written");
      expect(await count("SELECT count(*)::int AS n FROM notes WHERE body = 'fragile'")).toBe(1);
    } finally {
      await close();
    }
  });

  it("passes read-only tools through (no key, nothing saved) and keys idempotentHint tools only when asked", async () => {
    const { client, close } = await linked(tools, { authInfo: { clientId: "acct_1", token: "t1" } });
    try {
      const key = crypto.randomUUID();
      const c1 = await call(client, "count_notes", {}, key);
      await call(client, "add_note", { body: "one more" }, crypto.randomUUID());
      const c2 = await call(client, "count_notes", {}, key);
      expect(Number(text(c2))).toBe(Number(text(c1)) + 1); // ran again: not replayed
      expect(c2.structuredContent).toEqual({ key: null });
      expect(idempotencyMetaOf(c2)).toBeUndefined();

      const t1 = await call(client, "touch", { body: "x" });
      const t2 = await call(client, "touch", { body: "x" });
      expect(text(t1)).not.toBe(text(t2)); // no key: runs each time
      const k = crypto.randomUUID();
      const t3 = await call(client, "touch", { body: "x" }, k);
      const t4 = await call(client, "touch", { body: "x" }, k);
      expect(answered(t4)).toEqual(answered(t3));
      expect(idempotencyMetaOf(t4)?.replayed).toBe(true);

      const { tools: listed } = await client.listTools();
      const byName = Object.fromEntries(listed.map((t) => [t.name, t]));
      expect(byName.add_note!.inputSchema.properties).toHaveProperty("idempotency_key");
      expect(byName.add_note!._meta?.idempotency).toEqual({
        key: "required",
        meta: "idempotencyKey",
        argument: "idempotency_key",
        mode: "atomic",
      });
      expect(byName.touch!._meta?.idempotency).toMatchObject({ key: "optional" });
      expect(byName.delete_notes!._meta?.idempotency).toMatchObject({ key: "required" });

      // Destructive, even if idempotent: keyed, and its retry gets the first result, not "deleted 0".
      await call(client, "add_note", { body: "doomed" }, crypto.randomUUID());
      expect(idempotencyMetaOf(await call(client, "delete_notes", { body: "doomed" }))?.code).toBe(
        "idempotency-key-missing",
      );
      const dk = crypto.randomUUID();
      const deleted = await call(client, "delete_notes", { body: "doomed" }, dk);
      const deletedAgain = await call(client, "delete_notes", { body: "doomed" }, dk);
      expect(text(deleted)).toBe("deleted 1");
      expect(text(deletedAgain)).toBe("deleted 1");
      expect(byName.count_notes!._meta?.idempotency).toBeUndefined();
      expect(byName.count_notes!.inputSchema.properties ?? {}).not.toHaveProperty("idempotency_key");
    } finally {
      await close();
    }
  });

  it("takes zod v3 schemas too", async () => {
    const { client, close } = await linked((server) => {
      idempotentTools<Tx>(server, { store, scope: () => "acct_v3" }).registerTool(
        "add_v3",
        { inputSchema: z3.object({ body: z3.string() }) },
        async (args, { tx }) => {
          await tx.query("INSERT INTO notes (scope, body) VALUES ('acct_v3', $1)", [args.body]);
          return { content: [{ type: "text", text: "ok" }] };
        },
      );
    });
    try {
      const key = crypto.randomUUID();
      await call(client, "add_v3", { body: "v3", idempotency_key: key });
      const again = await call(client, "add_v3", { body: "v3" }, key);
      expect(idempotencyMetaOf(again)?.replayed).toBe(true);
      expect(await count("SELECT count(*)::int AS n FROM notes WHERE body = 'v3'")).toBe(1);
    } finally {
      await close();
    }
  });

  it("runs a phases tool through its runner: one provider charge, the retry replayed", async () => {
    const runner = definePhases<{ amount: number }, { chargeId: string }>({
      store,
      name: `mcp-charges-${backend.name}`,
      phases: {
        charge: {
          external: async (ctx) => {
            const r = await chargeProvider(provider.url, {
              amount: ctx.input.amount,
              currency: "eur",
              idempotencyKey: ctx.idempotencyKey,
              timeoutMs: 5_000,
            });
            if (r.kind === "declined") {
              return { response: jsonResponse(402, { type: "urn:x:declined", detail: "declined" }) };
            }
            if (r.kind !== "charged") throw new RetryableError("provider unavailable");
            return { data: { chargeId: r.charge.id } };
          },
          next: "record",
        },
        record: {
          local: async (ctx, tx) => {
            await tx.query("INSERT INTO notes (scope, body) VALUES ($1, $2)", [ctx.scope, ctx.data.chargeId]);
            return {
              response: toolResponse({
                content: [{ type: "text", text: `charged ${ctx.data.chargeId}` }],
                structuredContent: { charge: ctx.data.chargeId! },
              }),
            };
          },
        },
      },
    });
    const { client, close } = await linked((server) => {
      idempotentTools<Tx>(server, { scope: () => "acct_ph" }).registerTool("charge", {
        inputSchema: { amount: z.number().int() },
        phases: { runner, input: (args) => ({ amount: args.amount }) },
      });
    });
    try {
      const key = crypto.randomUUID();
      const first = await call(client, "charge", { amount: 1234 }, key);
      const again = await call(client, "charge", { amount: 1234 }, key);
      expect(text(first)).toMatch(/^charged ch_/);
      expect(answered(again)).toEqual(answered(first));
      expect(idempotencyMetaOf(again)).toMatchObject({ replayed: true, key });
      const mine = (await listCharges(provider.url)).filter((c) => c.amount === 1234);
      expect(mine).toHaveLength(1);
      const other = await call(client, "charge", { amount: 99 }, key);
      expect(idempotencyMetaOf(other)?.code).toBe("idempotency-key-mismatch");
    } finally {
      await close();
    }
  });

  it("refuses bad registrations at once", () => {
    const server = { registerTool() {} } as unknown as McpServer;
    expect(() => idempotentTools(server, {}).registerTool("x", {}, async () => ({ content: [] }))).toThrow(
      IdemOptionsError,
    );
    expect(() => idempotentTools(server, { store }).registerTool("x", {}, undefined as never)).toThrow(
      /handler/,
    );
    expect(() =>
      idempotentTools(server, { store }).registerTool("x", {
        annotations: { readOnlyHint: true },
        phases: { runner: { run: async () => ({}) as never } },
      }),
    ).toThrow(/required/);
  });
});

describe.each(serverBackends)("MCP tools, concurrent calls, on $name", (backend) => {
  let open: OpenDb;
  let store: PostgresStore;
  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
    await open.db.query("CREATE TABLE notes (id serial PRIMARY KEY, scope text, body text)");
    store = await PostgresStore.open(open.db, { lockTimeoutMs: 800 });
  });
  afterAll(async () => {
    await open?.close();
  });

  it("answers a duplicate while the first still runs with 'in progress' and when to ask again", async () => {
    const [gate, release] = latch();
    const [entered, enter] = latch();
    const { client, close } = await linked((server) => {
      idempotentTools<Tx>(server, { store, scope: () => "acct_c" }).registerTool(
        "slow_note",
        { inputSchema: { body: z.string() } },
        async (args, { tx }) => {
          await tx.query("INSERT INTO notes (scope, body) VALUES ('acct_c', $1)", [args.body]);
          enter();
          await gate;
          return { content: [{ type: "text", text: "slow done" }] };
        },
      );
    });
    try {
      const key = crypto.randomUUID();
      const first = call(client, "slow_note", { body: "slow" }, key);
      await entered;
      const dup = await call(client, "slow_note", { body: "slow" }, key);
      expect(dup.isError).toBe(true);
      expect(text(dup)).toMatch(/still in progress.*Ask again in \d+ s\./);
      expect(idempotencyMetaOf(dup)).toMatchObject({
        status: 409,
        code: "idempotency-key-in-flight",
        retrySameKey: true,
        operationState: "in_progress",
      });
      expect(idempotencyMetaOf(dup)!.retryAfterSeconds).toBeGreaterThanOrEqual(1);
      release();
      expect(text(await first)).toBe("slow done");
      const after = await call(client, "slow_note", { body: "slow" }, key);
      expect(idempotencyMetaOf(after)?.replayed).toBe(true);
      const { rows } = await open.db.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM notes WHERE body = 'slow'",
      );
      expect(rows[0]!.n).toBe(1);
    } finally {
      release();
      await close();
    }
  });
});
