/**
 * Inbound webhooks: verified and deduplicated deliveries per second (`idem/webhooks`) against a bare
 * handler that only verifies, and against one that verifies and writes the effect without
 * deduplicating, in one run on the real PostgreSQL. The servers (bench/webhooks-server.ts) run in a
 * child process: node:http, the same signature check (Stripe's scheme), pg pools of 20; the bare
 * effect is a named prepared statement. The load (this process) signs each delivery as Stripe does and
 * keeps BENCH_CONCURRENCY (default 32) in flight over keep-alive connections, in alternating half-second
 * slices so that every scenario sees the same machine.
 *
 *   verify only              the yardstick: what checking a signature costs
 *   verify + INSERT          a receiver without deduplication (a redelivery would apply twice)
 *   idem, new events         the inbox's mark and the INSERT in one transaction
 *   idem, redeliveries       every delivery an event already applied: answered from the mark
 *
 * Printed: deliveries per second, ratios to the yardstick, the server process's CPU and the bench
 * database's PostgreSQL backends' CPU per delivery.
 *
 *   npx tsx --conditions=source bench/webhooks.ts     (DATABASE_URL, default postgres://postgres@127.0.0.1:5432/test)
 *
 * BENCH_SECONDS (default 6) per scenario.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { createHmac, randomUUID } from "node:crypto";
import { once } from "node:events";
import { Agent, request } from "node:http";
import pg from "pg";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { backendsCpu, backendsDelta, processCpuUs } from "./compare/cpu.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";

const SECONDS = Number(process.env.BENCH_SECONDS ?? 6);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 32);
const SLICE_S = 0.5;
const SECRET = "whsec_bench_0123456789";

type Scenario = "verify" | "effect" | "idem-new" | "idem-redelivered";
const SCENARIOS: Scenario[] = ["verify", "effect", "idem-new", "idem-redelivered"];
const LABELS: Record<Scenario, string> = {
  verify: "verify only (bare handler)",
  effect: "verify + INSERT, no dedup",
  "idem-new": "idem: verify + inbox + INSERT, new events",
  "idem-redelivered": "idem: redeliveries of applied events",
};

export interface WebhooksBenchResult {
  /** Deliveries answered 200 per second, each scenario. */
  rate: Record<Scenario, number>;
  /** The server process's CPU per delivery (µs). */
  serverUs: Record<Scenario, number>;
  /** The bench database's PostgreSQL backends' CPU per delivery (µs). */
  postgresUs: Record<Scenario, number>;
  /** idem (new events) / verify only. */
  ratio: number;
}

function signed(id: string): { body: string; signature: string } {
  const body = JSON.stringify({
    id,
    object: "event",
    type: "payment_intent.succeeded",
    created: Math.floor(Date.now() / 1000),
    data: {
      object: {
        id: `pi_${id}`,
        object: "payment_intent",
        amount: 5000,
        currency: "eur",
        status: "succeeded",
      },
    },
  });
  const t = Math.floor(Date.now() / 1000);
  return {
    body,
    signature: `t=${t},v1=${createHmac("sha256", SECRET).update(`${t}.${body}`).digest("hex")}`,
  };
}

function post(agent: Agent, port: number, d: { body: string; signature: string }): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        agent,
        host: "127.0.0.1",
        port,
        method: "POST",
        path: "/",
        headers: {
          "content-type": "application/json",
          "stripe-signature": d.signature,
          "content-length": Buffer.byteLength(d.body),
        },
      },
      (res) => {
        res.resume();
        res.on("end", () => resolve(res.statusCode ?? 0));
      },
    );
    req.on("error", reject);
    req.end(d.body);
  });
}

async function startServers(url: string): Promise<{ child: ChildProcess; ports: Record<string, number> }> {
  const child = spawn(
    process.execPath,
    ["--conditions=source", "--import", "tsx", "bench/webhooks-server.ts"],
    {
      env: { ...process.env, DATABASE_URL: url, WEBHOOK_SECRET: SECRET },
      stdio: ["ignore", "pipe", "inherit"],
    },
  );
  const [line] = (await once(child.stdout!, "data")) as [Buffer];
  return { child, ports: JSON.parse(line.toString()) };
}

export async function webhooksBench(): Promise<WebhooksBenchResult> {
  const fresh = await freshBenchDatabase();
  const setup = fromPg(benchPool(fresh.url, { max: 2 }));
  await migrate(setup);
  await setup.exec("CREATE TABLE effects (event_id text NOT NULL, at timestamptz NOT NULL DEFAULT now())");
  await setup.close();
  const database = new URL(fresh.url).pathname.slice(1);
  const admin = new pg.Client({ connectionString: fresh.url });
  await admin.connect();
  const { child, ports } = await startServers(fresh.url);
  const agent = new Agent({ keepAlive: true, maxSockets: CONCURRENCY });
  const applied: string[] = [];
  const sides = Object.fromEntries(
    SCENARIOS.map((s) => [s, { n: 0, ms: 0, serverUs: 0, pgUs: 0 }]),
  ) as Record<Scenario, { n: number; ms: number; serverUs: number; pgUs: number }>;
  const portOf = (s: Scenario) => ports[s === "idem-new" || s === "idem-redelivered" ? "idem" : s]!;

  async function slice(s: Scenario, seconds: number): Promise<{ n: number; ms: number }> {
    let n = 0;
    let next = 0;
    const t0 = performance.now();
    const until = t0 + seconds * 1000;
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (performance.now() < until) {
          const id = s === "idem-redelivered" ? applied[next++ % applied.length]! : `evt_${randomUUID()}`;
          const status = await post(agent, portOf(s), signed(id));
          if (status !== 200) throw new Error(`${s}: the server answered ${status}`);
          if (s === "idem-new" && applied.length < 50_000) applied.push(id);
          n++;
        }
      }),
    );
    return { n, ms: performance.now() - t0 };
  }

  try {
    for (const s of SCENARIOS) await slice(s, 0.5); // warm-up (and events to redeliver)
    const rounds = Math.max(1, Math.round(SECONDS / SLICE_S));
    for (let round = 0; round < rounds; round++) {
      for (const s of round % 2 === 0 ? SCENARIOS : [...SCENARIOS].reverse()) {
        const cpu0 = processCpuUs(child.pid!);
        const pg0 = await backendsCpu(admin, database);
        const r = await slice(s, SLICE_S);
        const side = sides[s];
        side.serverUs += processCpuUs(child.pid!) - cpu0;
        side.pgUs += backendsDelta(pg0, await backendsCpu(admin, database));
        side.n += r.n;
        side.ms += r.ms;
      }
    }
    const per = <K extends "serverUs" | "pgUs">(k: K) =>
      Object.fromEntries(SCENARIOS.map((s) => [s, sides[s][k] / sides[s].n])) as Record<Scenario, number>;
    const rate = Object.fromEntries(SCENARIOS.map((s) => [s, (sides[s].n / sides[s].ms) * 1000])) as Record<
      Scenario,
      number
    >;
    const result: WebhooksBenchResult = {
      rate,
      serverUs: per("serverUs"),
      postgresUs: per("pgUs"),
      ratio: rate["idem-new"] / rate.verify,
    };
    console.log(
      `Stripe-signed deliveries to node:http servers (real PostgreSQL, pg pools of 20, ${CONCURRENCY} in flight, ${SECONDS} s each, interleaved)`,
    );
    for (const s of SCENARIOS) {
      console.log(
        `  ${LABELS[s].padEnd(44)} ${rate[s].toFixed(0).padStart(6)} deliveries/s (${sides[s].n}), ${(rate[s] / rate.verify).toFixed(2)} x verify only; server CPU ${result.serverUs[s].toFixed(0)} µs, PostgreSQL CPU ${result.postgresUs[s].toFixed(0)} µs per delivery`,
      );
    }
    console.log(
      `idem / verify only = ${result.ratio.toFixed(2)}, idem / verify + INSERT = ${(rate["idem-new"] / rate.effect).toFixed(2)}`,
    );
    return result;
  } finally {
    agent.destroy();
    child.kill();
    await once(child, "exit").catch(() => {});
    await admin.end();
    await fresh.drop();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  webhooksBench().catch((err) => {
    console.error(err);
    process.exitCode = 1;
  });
}
