/**
 * Issue 3's benchmark: payments per second through the phases runner (charge at the provider simulator
 * over HTTP with zero latency, then the payment row and its receipt in one local transaction) against
 * atomic mode doing the same local writes with no external call, in one run on the real PostgreSQL.
 * Library level (no HTTP server in front), so the figures compare the two modes, not a framework. The
 * simulator runs in a child process, like a provider on another machine.
 *
 *   npx tsx --conditions=source bench/phases.ts     (DATABASE_URL, default postgres://postgres@127.0.0.1:5432/test)
 *
 * BENCH_SECONDS (default 5) per mode, in alternating half-second slices; BENCH_CONCURRENCY (default 32)
 * payments in flight; a pool of 20 connections.
 */
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { type Claim, fingerprint, RetryableError } from "../src/core/index.ts";
import type { Db, Tx } from "../src/postgres/db.ts";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { writeOutbox } from "../src/postgres/outbox.ts";
import { definePhases, jsonResponse } from "../src/postgres/phases/index.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../src/postgres/store.ts";
import { chargeProvider, listCharges } from "../src/testing/provider-client.ts";
import { processCpuUs, processesCpuUs } from "./compare/cpu.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";

const SECONDS = Number(process.env.BENCH_SECONDS ?? 5);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 32);
const enc = new TextEncoder();

interface Pay {
  amount_cents: number;
  currency: string;
}

function claimFor(key: string, input: Pay): Claim {
  return {
    scope: "acct_bench",
    key,
    fingerprint: fingerprint({
      method: "POST",
      path: "/v1/payments",
      contentType: "application/json",
      body: enc.encode(JSON.stringify(input)),
    }),
  };
}

/**
 * The simulator in a process of its own, as a real provider would be (and as `idem provider` runs it):
 * its CPU is not the runner's.
 */
async function spawnProvider(): Promise<{ url: string; pid: number; close(): void }> {
  const script = `const { startProvider } = await import(${JSON.stringify(new URL("../src/testing/provider.ts", import.meta.url).href)});
    const p = await startProvider({ port: 0, seed: 1, latencyMs: 0 });
    console.log("listening " + p.url);`;
  const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const url = await new Promise<string>((resolve, reject) => {
    let out = "";
    child.stdout!.on("data", (d) => {
      out += d;
      const m = /listening (\S+)/.exec(out);
      if (m) resolve(m[1]!);
    });
    child.once("exit", (code) => reject(new Error(`the provider simulator exited (${code})`)));
  });
  return { url, pid: child.pid ?? 0, close: () => child.kill() };
}

/**
 * CPU time (µs) used so far by the PostgreSQL server's processes and by the simulator's, read from
 * /proc (Linux; zeros elsewhere). With the runner's own figure, it shows where a payment's CPU goes on
 * a machine where all three share the cores.
 */
function otherCpuUs(simulatorPid: number): { postgres: number; simulator: number } {
  return { postgres: processesCpuUs("postgres"), simulator: processCpuUs(simulatorPid) };
}

/** The local writes of one payment: the same in both modes. */
async function recordPayment(tx: Tx, chargeId: string, input: Pay): Promise<void> {
  await tx.query("INSERT INTO payments (id, amount_cents, currency) VALUES ($1, $2, $3)", [
    `pay_${chargeId}`,
    input.amount_cents,
    input.currency,
  ]);
  await writeOutbox(tx, {
    topic: "receipt-email",
    type: "payment.succeeded",
    payload: { charge: chargeId, amount_cents: input.amount_cents },
  });
}

/** Run `one` with CONCURRENCY workers for `seconds`; payments per second. Latencies go to `latencies`. */
async function measure(
  one: (i: number) => Promise<void>,
  seconds: number,
  latencies?: number[],
): Promise<{ rps: number; n: number }> {
  let n = 0;
  let next = 0;
  const until = performance.now() + seconds * 1000;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (performance.now() < until) {
        const t = performance.now();
        await one(next++);
        latencies?.push(performance.now() - t);
        n++;
      }
    }),
  );
  return { rps: n / ((performance.now() - t0) / 1000), n };
}

export interface ModeResult {
  rps: number;
  n: number;
  p50Ms: number;
  p99Ms: number;
  /** CPU per payment (µs) in the runner's process (runner, driver, load generator). */
  cpuUsPerPayment: number;
  /** CPU per payment (µs) in PostgreSQL's processes (0 where /proc is missing). */
  postgresUsPerPayment: number;
  /** CPU per payment (µs) in the provider simulator's process. */
  simulatorUsPerPayment: number;
}

export interface PhasesBenchResult {
  concurrency: number;
  seconds: number;
  atomic: ModeResult;
  phases: ModeResult & { charges: number };
  /** phases / atomic payments per second. */
  ratio: number;
}

/** One mode's slices summed up, per payment. */
function modeResult(m: {
  rps: number;
  n: number;
  cpu: number;
  pg: number;
  sim: number;
  latencies: number[];
}): ModeResult {
  return {
    rps: m.rps,
    n: m.n,
    p50Ms: percentile(m.latencies, 0.5),
    p99Ms: percentile(m.latencies, 0.99),
    cpuUsPerPayment: m.cpu / m.n,
    postgresUsPerPayment: m.pg / m.n,
    simulatorUsPerPayment: m.sim / m.n,
  };
}

function percentile(xs: number[], q: number): number {
  const sorted = [...xs].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN;
}

export async function phasesBench(): Promise<PhasesBenchResult> {
  const fresh = await freshBenchDatabase();
  const db: Db = fromPg(benchPool(fresh.url, { max: 20, pipeline: true }));
  const provider = await spawnProvider();
  try {
    await migrate(db);
    await db.exec(`CREATE TABLE payments (id text PRIMARY KEY, amount_cents int NOT NULL, currency text NOT NULL,
                   created_at timestamptz NOT NULL DEFAULT now())`);
    const store = await PostgresStore.open(db);
    const run = randomUUID().slice(0, 8);
    const input: Pay = { amount_cents: 5000, currency: "eur" };

    const phases = definePhases<Pay, { chargeId: string }>({
      store,
      name: "bench-payments",
      phases: {
        started: {
          external: async (ctx) => {
            const r = await chargeProvider(provider.url, {
              amount: ctx.input.amount_cents,
              currency: ctx.input.currency,
              idempotencyKey: ctx.idempotencyKey,
              timeoutMs: 10_000,
              signal: ctx.signal,
            });
            if (r.kind !== "charged") throw new RetryableError(`provider: ${r.kind}`);
            return { data: { chargeId: r.charge.id } };
          },
          next: "charged",
        },
        charged: {
          local: async (ctx, tx) => {
            await recordPayment(tx, ctx.data.chargeId!, ctx.input);
            return { response: jsonResponse(201, { charge: ctx.data.chargeId }) };
          },
        },
      },
    });
    const atomicOne = async (i: number) => {
      const out = await store.atomic(claimFor(`atomic-${run}-${i}`, input), async (tx) => {
        await recordPayment(tx, `local_${run}_${i}`, input);
        const response = jsonResponse(201, { charge: `local_${run}_${i}` });
        return { response, save: response };
      });
      if (out.kind !== "executed") throw new Error("atomic: expected a first execution");
    };
    const phasesOne = async (i: number) => {
      const out = await phases.run(claimFor(`phases-${run}-${i}`, input), input);
      if (out.kind !== "executed" || out.response.status !== 201) throw new Error("phases: expected 201");
    };

    // Warm up both paths (connections, prepared statements, JIT). Then alternate short slices of each
    // mode, so that both see the same machine (a shared CI box's load drifts over seconds).
    await measure((i) => atomicOne(1e9 + i), 0.5);
    await measure((i) => phasesOne(1e9 + i), 0.5);
    await fetch(`${provider.url}/_sim/reset`, { method: "POST" });
    const atomic = { n: 0, s: 0, rps: 0, cpu: 0, pg: 0, sim: 0, latencies: [] as number[] };
    const phased = { n: 0, s: 0, rps: 0, cpu: 0, pg: 0, sim: 0, latencies: [] as number[] };
    const others = (into: typeof atomic, before: { postgres: number; simulator: number }) => {
      const after = otherCpuUs(provider.pid);
      into.pg += after.postgres - before.postgres;
      into.sim += after.simulator - before.simulator;
    };
    const cpu = () => {
      const u = process.cpuUsage();
      return u.user + u.system;
    };
    const SLICE = 0.5;
    let offset = 0;
    for (let round = 0; round < Math.max(1, Math.round(SECONDS / SLICE)); round++) {
      let o0 = otherCpuUs(provider.pid);
      let c0 = cpu();
      const a = await measure((i) => atomicOne(offset + i), SLICE, atomic.latencies);
      atomic.cpu += cpu() - c0;
      others(atomic, o0);
      offset += a.n + CONCURRENCY;
      o0 = otherCpuUs(provider.pid);
      c0 = cpu();
      const p = await measure((i) => phasesOne(offset + i), SLICE, phased.latencies);
      phased.cpu += cpu() - c0;
      others(phased, o0);
      offset += p.n + CONCURRENCY;
      atomic.n += a.n;
      atomic.s += a.n / a.rps;
      phased.n += p.n;
      phased.s += p.n / p.rps;
    }
    atomic.rps = atomic.n / atomic.s;
    phased.rps = phased.n / phased.s;
    const charges = (await listCharges(provider.url)).length;

    const ratio = phased.rps / atomic.rps;
    console.log(
      `Phases mode vs atomic mode (real PostgreSQL, pg pipelined, pool 20, ${CONCURRENCY} in flight, ${SECONDS} s each, interleaved)`,
    );
    console.log(
      `  atomic (payment row + receipt, one transaction)        ${atomic.rps.toFixed(0).padStart(6)} payments/s  (${atomic.n})`,
    );
    console.log(
      `  phases (provider charge over HTTP, then the same rows) ${phased.rps.toFixed(0).padStart(6)} payments/s  (${phased.n}, ${charges} provider charges)`,
    );
    console.log(
      `  this process's CPU per payment: atomic ${(atomic.cpu / atomic.n).toFixed(0)} µs, phases ${(phased.cpu / phased.n).toFixed(0)} µs (runner, driver and load generator; the simulator runs in its own process); CPU busy ${((100 * (atomic.cpu + phased.cpu)) / 1e6 / (atomic.s + phased.s)).toFixed(0)}% of one core`,
    );
    console.log(
      `  PostgreSQL's CPU per payment: atomic ${(atomic.pg / atomic.n).toFixed(0)} µs, phases ${(phased.pg / phased.n).toFixed(0)} µs; the simulator's: ${(phased.sim / phased.n).toFixed(0)} µs per phases payment`,
    );
    console.log(`phases / atomic = ${ratio.toFixed(2)}  (goal >= 0.50)`);
    return {
      concurrency: CONCURRENCY,
      seconds: SECONDS,
      atomic: modeResult(atomic),
      phases: { ...modeResult(phased), charges },
      ratio,
    };
  } finally {
    provider.close();
    await db.close();
    await fresh.drop();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  phasesBench().catch((err) => {
    console.error(err);
    process.exitCode = 1;
  });
}
