/**
 * Issue 2's benchmark: the payment endpoint over HTTP on the real PostgreSQL, in one run:
 * unkeyed (the same endpoint with the key optional and absent), keyed first-time, keyed replay (these
 * three in alternating 2-second slices, BENCH_SECONDS each in all, default 6), and a storm of 1,000 concurrent
 * requests over 10 keys. The service runs in its own process; the load comes
 * from autocannon in this one.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import autocannon from "autocannon";
import pg from "pg";

export interface Row {
  scenario: string;
  rps: number;
  p50: number;
  p99: number;
  note?: string;
}

const BASE = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const DURATION_S = Number(process.env.BENCH_SECONDS ?? 6);
const SLICE_S = 2;
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 32);
const BODY = JSON.stringify({ amount_cents: 5000, currency: "eur" });
const HEADERS = { authorization: "Bearer sk_test_demo_1", "content-type": "application/json" };

async function admin<T>(fn: (c: pg.Client) => Promise<T>, url = BASE): Promise<T> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

export async function freshBenchDatabase(): Promise<{ url: string; drop(): Promise<void> }> {
  const name = `idem_bench_${randomUUID().slice(0, 8)}`;
  await admin((c) => c.query(`CREATE DATABASE ${name}`));
  const url = new URL(BASE);
  url.pathname = `/${name}`;
  const drop = async () => {
    await admin((c) => c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`));
  };
  return { url: url.toString(), drop };
}

/**
 * A pool on a bench database. It listens for errors: pg-pool's `end()` resolves before its connections
 * have closed, so the DROP DATABASE ... FORCE that follows can cut one, and an unheard 'error' event
 * would end the whole bench run.
 */
export function benchPool(url: string, options: { max: number; pipeline?: boolean }): pg.Pool {
  const pool = new pg.Pool({ connectionString: url, ...options } as pg.PoolConfig);
  pool.on("error", () => {});
  return pool;
}

export function startService(env: Record<string, string>): Promise<{ url: string; child: ChildProcess }> {
  const child = spawn("node_modules/.bin/tsx", ["--conditions=source", "app/main.ts"], {
    env: { ...process.env, PORT: "0", IDEM_DEMO: "1", LOG_LEVEL: "warn", ...env },
    stdio: ["ignore", "pipe", "inherit"],
  });
  return new Promise((resolve, reject) => {
    let out = "";
    child.stdout!.on("data", (d) => {
      out += d;
      const m = /on (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
      if (m) resolve({ url: m[1]!, child });
    });
    child.once("exit", (code) => reject(new Error(`service exited (${code}): ${out}`)));
  });
}

function load(
  url: string,
  opts: { setup?: (req: any) => any; connections?: number; amount?: number; duration?: number },
): Promise<autocannon.Result> {
  return new Promise((resolve, reject) => {
    autocannon(
      {
        url: `${url}/v1/payments`,
        method: "POST",
        headers: HEADERS,
        body: BODY,
        connections: opts.connections ?? CONNECTIONS,
        ...(opts.amount ? { amount: opts.amount } : { duration: opts.duration ?? DURATION_S }),
        requests: opts.setup ? [{ setupRequest: opts.setup }] : undefined,
      },
      (err, result) => (err ? reject(err) : resolve(result)),
    );
  });
}

/** Slices of one scenario as one row: requests over time in total; p50 and p99 the median of the slices'. */
function combined(scenario: string, runs: autocannon.Result[]): Row {
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;
  const total = runs.reduce((n, r) => n + r.requests.total, 0);
  const seconds = runs.reduce((n, r) => n + r.duration, 0);
  const bad = runs.reduce((n, r) => n + r.non2xx + r.errors + r.timeouts, 0);
  return {
    scenario,
    rps: total / seconds,
    p50: median(runs.map((r) => r.latency.p50)),
    p99: median(runs.map((r) => r.latency.p99)),
    note: bad ? `${bad} non-2xx/errors!` : undefined,
  };
}

function row(scenario: string, r: autocannon.Result, note?: string): Row {
  const bad = r.non2xx + r.errors + r.timeouts;
  return {
    scenario,
    rps: r.requests.average,
    p50: r.latency.p50,
    p99: r.latency.p99,
    note: bad ? `${bad} non-2xx/errors! ${note ?? ""}` : note,
  };
}

export async function httpBench(): Promise<Row[]> {
  const db = await freshBenchDatabase();
  const svc = await startService({
    DATABASE_URL: db.url,
    IDEM_OPTIONAL_KEY: "1",
    IDEM_POOL_SIZE: "16",
    IDEM_PAYMENTS_MODE: "atomic",
  });
  const rows: Row[] = [];
  try {
    const count = () =>
      admin(async (c) => Number((await c.query("SELECT count(*) AS n FROM payments")).rows[0].n), db.url);
    // Warm-up: connections, JIT, plan caches.
    await load(svc.url, {
      duration: 2,
      setup: (req) => ({ ...req, headers: { ...req.headers, "idempotency-key": randomUUID() } }),
    });

    // The three scenarios in alternating slices, so that all of them see the same machine
    // (a shared box's load drifts over seconds, and the ratios below are what this bench is for).
    const keys: string[] = [];
    let i = 0;
    const scenarios: { name: string; setup?: (req: any) => any; runs: autocannon.Result[] }[] = [
      { name: "unkeyed (same endpoint, no key)", runs: [] },
      {
        name: "keyed, first time",
        setup: (req) => {
          const key = randomUUID();
          keys.push(key);
          return { ...req, headers: { ...req.headers, "idempotency-key": key } };
        },
        runs: [],
      },
      {
        name: "keyed, replay",
        setup: (req) => ({
          ...req,
          headers: { ...req.headers, "idempotency-key": keys[i++ % keys.length]! },
        }),
        runs: [],
      },
    ];
    // Slices of 2 s: shorter ones are dominated by autocannon's ramp-up and the previous slice's tail.
    for (let round = 0; round < Math.max(1, Math.round(DURATION_S / SLICE_S)); round++) {
      const order = round % 2 === 0 ? scenarios : [scenarios[2]!, scenarios[1]!, scenarios[0]!];
      for (const sc of order) sc.runs.push(await load(svc.url, { duration: SLICE_S, setup: sc.setup }));
    }
    for (const sc of scenarios) rows.push(combined(sc.name, sc.runs));

    const before = await count();
    const stormKeys = Array.from({ length: 10 }, () => randomUUID());
    let j = 0;
    const storm = await load(svc.url, {
      connections: 1000,
      amount: 1000,
      setup: (req) => ({ ...req, headers: { ...req.headers, "idempotency-key": stormKeys[j++ % 10]! } }),
    });
    const executions = (await count()) - before;
    rows.push(row("storm: 1,000 concurrent over 10 keys", storm, `executions: ${executions} (must be 10)`));
  } finally {
    svc.child.kill("SIGTERM");
    await new Promise((r) => svc.child.once("exit", r));
    await db.drop();
  }
  return rows;
}

export function printRows(title: string, rows: Row[]): void {
  console.log(`\n${title}`);
  console.log("| scenario | req/s | p50 ms | p99 ms | note |\n|---|---:|---:|---:|---|");
  for (const r of rows)
    console.log(`| ${r.scenario} | ${r.rps.toFixed(0)} | ${r.p50} | ${r.p99} | ${r.note ?? ""} |`);
}
