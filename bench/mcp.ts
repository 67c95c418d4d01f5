/**
 * A keyed MCP tool call (idem/mcp, atomic mode) against the bare tool, in one run: the SDK's own client
 * and an `McpServer` linked in memory (no HTTP: what is measured is the tool call), the same
 * one-INSERT payment on the same pg pool (10, pipeline), 16 calls in flight. The bare tool is what one
 * writes without idem: the INSERT alone, one round trip. The keyed tool claims a new key per call and
 * saves its result in the same transaction; "replay" sends a key again and gets the saved result.
 * Interleaved rounds; per scenario the median throughput, and CPU per call of this process (client and
 * server together) and of the database's backends (PostgreSQL, from /proc).
 *
 *   npm run bench -- --only mcp     or     npx tsx --conditions=source bench/mcp.ts
 *
 * MCP_ROUNDS (default 5), MCP_CALLS (calls per scenario and round, default 2,000). DATABASE_URL; a
 * database of its own, dropped.
 */
import { randomUUID } from "node:crypto";
import { pathToFileURL } from "node:url";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import pg from "pg";
import { z } from "zod";
import { idempotentTools } from "../src/mcp/index.ts";
import type { Tx } from "../src/postgres/db.ts";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../src/postgres/store.ts";
import { backendsCpu, backendsDelta } from "./compare/cpu.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";

const ROUNDS = Number(process.env.MCP_ROUNDS ?? 5);
const CALLS = Number(process.env.MCP_CALLS ?? 2_000);
const IN_FLIGHT = 16;
const INSERT = "INSERT INTO notes (amount_cents, currency) VALUES ($1, $2) RETURNING id";

export type McpScenario = "bare" | "keyed" | "replay";
export interface McpBenchRow {
  scenario: McpScenario;
  /** Calls per second, median of the rounds. */
  callsPerSecond: number;
  /** CPU per call in this process (the SDK's client and server, and idem), µs. */
  nodeUsPerCall: number;
  /** CPU per call in the database's PostgreSQL backends, µs. */
  postgresUsPerCall: number;
}
export interface McpBenchResult {
  rows: McpBenchRow[];
  /** keyed / bare throughput, median of the per-round ratios. */
  keyedRatio: number;
  /** replay / bare throughput, median of the per-round ratios. */
  replayRatio: number;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

export async function mcpBench(): Promise<McpBenchResult> {
  const fresh = await freshBenchDatabase();
  const admin = new pg.Client({
    connectionString: process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test",
  });
  await admin.connect();
  const dbName = new URL(fresh.url).pathname.slice(1);
  const db = fromPg(benchPool(fresh.url, { max: 10, pipeline: true }));
  let client: Client | undefined;
  try {
    await migrate(db);
    await db.exec(
      "CREATE TABLE notes (id bigserial PRIMARY KEY, amount_cents int NOT NULL, currency text NOT NULL)",
    );
    const store = await PostgresStore.open(db);
    const server = new McpServer({ name: "bench", version: "1.0.0" });
    const input = { amount_cents: z.number().int(), currency: z.string() };
    const answer = (id: unknown) => ({ content: [{ type: "text" as const, text: `payment ${id}` }] });
    server.registerTool("bare_payment", { inputSchema: input }, async (args) => {
      const { rows } = await db.query(INSERT, [args.amount_cents, args.currency]);
      return answer(rows[0]!.id);
    });
    idempotentTools<Tx>(server, { store, scope: () => "acct_bench" }).registerTool(
      "keyed_payment",
      { inputSchema: input },
      async (args, { tx }) => {
        const { rows } = await tx.query(INSERT, [args.amount_cents, args.currency]);
        return answer(rows[0]!.id);
      },
    );
    const [serverSide, clientSide] = InMemoryTransport.createLinkedPair();
    await server.connect(serverSide);
    client = new Client({ name: "bench", version: "1.0.0" });
    await client.connect(clientSide);
    const c = client;
    const args = { amount_cents: 5000, currency: "eur" };
    const replayKeys: string[] = [];
    const call: Record<McpScenario, (i: number) => Promise<unknown>> = {
      bare: () => c.callTool({ name: "bare_payment", arguments: args }),
      keyed: (i) => {
        const key = randomUUID();
        if (i < IN_FLIGHT * 4) replayKeys.push(key);
        return c.callTool({ name: "keyed_payment", arguments: args, _meta: { idempotencyKey: key } });
      },
      replay: (i) =>
        c.callTool({
          name: "keyed_payment",
          arguments: args,
          _meta: { idempotencyKey: replayKeys[i % replayKeys.length]! },
        }),
    };
    const run = async (scenario: McpScenario, calls: number) => {
      let next = 0;
      const worker = async () => {
        while (next < calls) {
          const r = (await call[scenario](next++)) as { isError?: boolean };
          if (r.isError) throw new Error(`${scenario}: a call failed: ${JSON.stringify(r)}`);
        }
      };
      await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
    };
    // Warm up every path (JIT, prepared plans, the pool) and make the keys the replays send.
    for (const s of ["bare", "keyed", "replay"] as const) await run(s, Math.min(CALLS, 500));

    const per: Record<McpScenario, { rps: number[]; node: number[]; pg: number[] }> = {
      bare: { rps: [], node: [], pg: [] },
      keyed: { rps: [], node: [], pg: [] },
      replay: { rps: [], node: [], pg: [] },
    };
    const keyedRatios: number[] = [];
    const replayRatios: number[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      const order: McpScenario[] =
        round % 2 === 0 ? ["bare", "keyed", "replay"] : ["replay", "keyed", "bare"];
      const rps: Partial<Record<McpScenario, number>> = {};
      for (const s of order) {
        const pgBefore = await backendsCpu(admin, dbName);
        const cpuBefore = process.cpuUsage();
        const t0 = performance.now();
        await run(s, CALLS);
        const ms = performance.now() - t0;
        const cpu = process.cpuUsage(cpuBefore);
        const pgUs = backendsDelta(pgBefore, await backendsCpu(admin, dbName));
        rps[s] = (CALLS / ms) * 1000;
        per[s].rps.push(rps[s]);
        per[s].node.push((cpu.user + cpu.system) / CALLS);
        per[s].pg.push(pgUs / CALLS);
      }
      keyedRatios.push(rps.keyed! / rps.bare!);
      replayRatios.push(rps.replay! / rps.bare!);
    }
    const rows = (["bare", "keyed", "replay"] as const).map(
      (scenario): McpBenchRow => ({
        scenario,
        callsPerSecond: median(per[scenario].rps),
        nodeUsPerCall: median(per[scenario].node),
        postgresUsPerCall: median(per[scenario].pg),
      }),
    );
    const result = { rows, keyedRatio: median(keyedRatios), replayRatio: median(replayRatios) };
    printMcp(result);
    return result;
  } finally {
    await client?.close().catch(() => {});
    await db.close();
    await admin.end();
    await fresh.drop();
  }
}

/** The figures as lines (`npm run bench` keeps them as the section's note). */
function printMcp(r: McpBenchResult): void {
  const f0 = (n: number) => n.toLocaleString("en-US", { maximumFractionDigits: 0 });
  console.log(`MCP tool call, in memory, ${IN_FLIGHT} in flight, ${ROUNDS} rounds of ${CALLS} calls:`);
  for (const row of r.rows) {
    console.log(
      `  ${row.scenario.padEnd(6)} ${f0(row.callsPerSecond).padStart(7)} calls/s   CPU per call: node ${f0(row.nodeUsPerCall)} µs, PostgreSQL ${f0(row.postgresUsPerCall)} µs`,
    );
  }
  console.log(
    `  keyed / bare ${r.keyedRatio.toFixed(2)}, replay / bare ${r.replayRatio.toFixed(2)} (median of rounds)`,
  );
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await mcpBench();
