/**
 * `npm run bench`: every benchmark, each printing figures measured in one run (ratios, not absolute
 * timings compared across runs), then a report of them all: bench/results/latest.md (tables, with the
 * machine's description) and bench/results/latest.svg (throughput and p99 per scenario).
 *
 * Needs the real PostgreSQL: DATABASE_URL, default postgres://postgres@127.0.0.1:5432/test (each
 * benchmark works in a database of its own and drops it). The messaging benchmark also needs RabbitMQ
 * and NATS (AMQP_URL, NATS_URL). A benchmark that fails is reported as not measured; the others run.
 *
 * The comparison with a bare handler and the peers (bench/compare) also needs Redis (REDIS_URL) and wrk.
 *
 * `npm run bench -- --only compare,http` (or BENCH_ONLY=...) runs a subset of
 * http, compare, client, phases, messaging, outbox-notify, webhooks, keys, prepared, pg-driver, sealing, otel, retention, scale, citus, lambda, mcp (or names after `--`:
 * `npm run bench -- scale`); the report keeps the others' figures from the
 * previous run, marked as such. `npm run bench -- soak` (only when named: it runs for a long time)
 * pushes 1,000,000 events and keyed payments through and reports memory over time (bench/soak.ts). `--quick` (or BENCH_QUICK=1): the comparison's short mode (about a minute).
 */
import { existsSync } from "node:fs";
import { relative } from "node:path";
import { clientBench } from "./client.ts";
import { compareBench } from "./compare/index.ts";
import { httpBench, printRows } from "./http.ts";
import { phasesBench } from "./phases.ts";
import { writeReadmeFigures } from "./readme.ts";
import { describeMachine, withPrevious, writeReport } from "./report.ts";
import type { BenchResult, Report } from "./report-types.ts";
import { printRetention, retentionBench } from "./retention.ts";

const DATABASE_URL = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const argv = process.argv.slice(2);
const onlyArg = argv.find((a, i) => a.startsWith("--only=") || argv[i - 1] === "--only");
const bareNames = argv.filter((a, i) => !a.startsWith("--") && argv[i - 1] !== "--only");
const ONLY = (
  onlyArg?.replace(/^--only=/, "") ?? (bareNames.length ? bareNames.join(",") : process.env.BENCH_ONLY)
)
  ?.split(",")
  .map((s) => s.trim())
  .filter(Boolean);
const QUICK = argv.includes("--quick") || process.env.BENCH_QUICK === "1";
const wanted = (name: string) => !ONLY || ONLY.includes(name);
const started = performance.now();

const report: Report = {
  machine: await describeMachine(DATABASE_URL),
  results: [],
  figures: [],
  notes: [],
  failures: [],
  highlights: [],
};
const highlight = (line: string) => report.highlights!.push(line);
const result = (r: BenchResult) => report.results.push(r);
const figure = (group: string, name: string, value: string, note?: string) =>
  report.figures.push({ group, name, value, ...(note ? { note } : {}) });

/** Run one benchmark; a failure is printed and reported, and the run goes on. */
async function section<T>(group: string, fn: () => Promise<T>, timeoutMs = 600_000): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      fn(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no result within ${timeoutMs / 1000} s`)), timeoutMs);
      }),
    ]);
  } catch (err) {
    const message = (err as Error)?.message ?? String(err);
    console.error(`${group}: failed: ${message}`);
    report.failures.push({ group, error: message.split("\n")[0]! });
    return undefined;
  } finally {
    clearTimeout(timer);
  }
}

/** Call `fn` while keeping a copy of what it prints with console.log. */
async function capturing<T>(fn: () => Promise<T>): Promise<{ value: T; lines: string[] }> {
  const lines: string[] = [];
  const log = console.log;
  console.log = (...args: unknown[]) => {
    log(...args);
    lines.push(...args.map(String).join(" ").split("\n"));
  };
  try {
    return { value: await fn(), lines };
  } finally {
    console.log = log;
  }
}

const f0 = (n: number) => n.toLocaleString("en-US", { maximumFractionDigits: 0 });
const f2 = (n: number) => n.toFixed(2);

// --- Issue 2: the payment endpoint over HTTP ------------------------------------------------------------
if (wanted("http")) {
  const group = "Payment endpoint over HTTP (atomic mode, autocannon, 32 connections)";
  const rows = await section(group, () => httpBench());
  if (rows) {
    printRows("Payment endpoint over HTTP (real PostgreSQL, autocannon, 32 connections)", rows);
    for (const r of rows) {
      result({
        group,
        scenario: r.scenario,
        throughput: r.rps,
        unit: "req/s",
        p50Ms: r.p50,
        p99Ms: r.p99,
        note: r.note,
      });
    }
    const [unkeyed, keyed, replay] = rows;
    if (unkeyed && keyed && replay) {
      const first = keyed.rps / unkeyed.rps;
      const again = replay.rps / unkeyed.rps;
      console.log(`keyed first-time / unkeyed = ${f2(first)}  (goal >= 0.80)`);
      console.log(`keyed replay / unkeyed     = ${f2(again)}  (goal >= 1.00)`);
      figure(group, "keyed first-time / unkeyed", f2(first), "goal >= 0.80");
      figure(group, "keyed replay / unkeyed", f2(again), "goal >= 1.00");
      highlight(`HTTP: keyed first-time / unkeyed ${f2(first)}, keyed replay / unkeyed ${f2(again)}`);
    }
  }
}

// --- Issue 15: against a bare handler and the peers users pick ---------------------------------------------
if (wanted("compare")) {
  const group = "Against a bare handler and the peers (same handler, wrk, 32 connections)";
  console.log(`\n${group}${QUICK ? " (--quick)" : ""}`);
  // A full run measures 17 servers in 4 rounds (about 15 minutes on the 2-core machine).
  const c = await section(group, () => compareBench({ quick: QUICK }), QUICK ? 300_000 : 1_800_000);
  if (c) {
    report.comparison = { group, data: c, machine: report.machine };
    const best = (kind: string) =>
      c.rows
        .filter((r) => r.kind === kind && r.keyedRatio)
        .sort((a, b) => b.keyedRatio!.median - a.keyedRatio!.median)[0];
    const idem = best("idem");
    const peer = best("peer");
    const line = (r: typeof idem) =>
      r ? `${r.label} ${f2(r.keyedRatio!.median)} keyed / ${f2(r.replayRatio!.median)} replay` : "";
    highlight(`Against a bare handler: best idem adapter ${line(idem)}; best peer ${line(peer)}`);
  }
}

// --- The client's overhead ------------------------------------------------------------------------------
if (wanted("client")) {
  const group = "Client overhead on the success path (loopback)";
  console.log("\nClient overhead on the success path");
  const c = await section(group, () => clientBench());
  if (c) {
    const note = `${f0(c.requests)} requests each, concurrency ${c.concurrency}`;
    result({ group, scenario: "plain fetch", throughput: c.fetchRps, unit: "req/s", note });
    result({
      group,
      scenario: "idem client (intent, timers, budget, breaker)",
      throughput: c.clientRps,
      unit: "req/s",
      note,
    });
    figure(group, "client time / fetch time (median of rounds)", f2(c.ratio), "target <= 1.05");
    const verdict = c.ratio <= 1.05 ? "reached" : "not reached";
    console.log(`client time / fetch time: ${f2(c.ratio)} (median of rounds), goal <= 1.05: ${verdict}`);
    highlight(`Client time / fetch time on the success path: ${f2(c.ratio)} (goal <= 1.05)`);
    figure(group, "CPU-time ratio", f2(c.cpuRatio));
    figure(group, "fetch with a timeout signal alone / fetch", f2(c.timeoutSignalRatio));
  }
}

// --- Issue 3: phases mode against atomic mode -----------------------------------------------------------
if (wanted("phases")) {
  const group = "Phases mode (provider over HTTP) vs atomic mode (library level)";
  console.log("\nPhases mode (provider over HTTP) against atomic mode, same run");
  const p = await section(group, () => phasesBench());
  if (p) {
    const note = `${p.concurrency} in flight, ${p.seconds} s each, interleaved`;
    result({
      group,
      scenario: "atomic: payment row + receipt, one transaction",
      throughput: p.atomic.rps,
      unit: "payments/s",
      p50Ms: p.atomic.p50Ms,
      p99Ms: p.atomic.p99Ms,
      note,
    });
    result({
      group,
      scenario: "phases: provider charge, then the same rows",
      throughput: p.phases.rps,
      unit: "payments/s",
      p50Ms: p.phases.p50Ms,
      p99Ms: p.phases.p99Ms,
      note: `${note}; ${f0(p.phases.charges)} provider charges`,
    });
    figure(group, "phases / atomic", f2(p.ratio), "goal >= 0.50");
    highlight(`Phases mode (a provider call per payment) / atomic mode: ${f2(p.ratio)}`);
    figure(
      group,
      "CPU per payment in the runner's process",
      `${f0(p.atomic.cpuUsPerPayment)} µs / ${f0(p.phases.cpuUsPerPayment)} µs`,
      "atomic / phases",
    );
    figure(
      group,
      "CPU per payment in PostgreSQL",
      `${f0(p.atomic.postgresUsPerPayment)} µs / ${f0(p.phases.postgresUsPerPayment)} µs`,
      "atomic / phases: the claim and the recovery point are two more commits",
    );
    figure(
      group,
      "CPU per payment in the provider simulator",
      `${f0(p.phases.simulatorUsPerPayment)} µs`,
      "a real provider's is not on this machine",
    );
  }
}

/**
 * A benchmark file of another issue, if it exists: its exported `...Bench` function is called, what it
 * prints is kept as a note, and rows it returns in a known shape become results.
 */
async function optionalBench(
  name: string,
  group: string,
  toResults?: (value: unknown) => BenchResult[],
  timeoutMs?: number,
) {
  const url = new URL(`./${name}.ts`, import.meta.url);
  if (!existsSync(url)) return;
  const mod: Record<string, unknown> = await import(url.href);
  const entry = Object.entries(mod).find(([k, v]) => typeof v === "function" && /Bench$/.test(k));
  if (!entry) {
    report.failures.push({ group, error: `bench/${name}.ts exports no ...Bench function` });
    return;
  }
  console.log(`\n${group}`);
  const out = await section(group, () => capturing(() => (entry[1] as () => Promise<unknown>)()), timeoutMs);
  if (!out) return;
  const rows = toResults?.(out.value) ?? [];
  for (const r of rows) result(r);
  const lines = out.lines.filter((l) => l.trim());
  if (lines.length) report.notes.push({ group, lines });
}

// --- Issue 5: outbox -> broker -> inbox (bench/messaging.ts) ---------------------------------------------
if (wanted("messaging")) {
  const group = "Messaging: outbox -> broker -> inbox";
  await optionalBench("messaging", group, (value) => {
    if (!Array.isArray(value)) return [];
    return value.flatMap((r: Record<string, unknown>): BenchResult[] =>
      typeof r.broker === "string" && typeof r.endToEndRate === "number"
        ? [
            {
              group,
              scenario:
                typeof r.scenario === "string"
                  ? r.scenario
                  : `${r.broker}: end to end, effect ${r.effect === "batch" ? "per batch" : "per message"}`,
              throughput: r.endToEndRate,
              unit: "events/s",
              p50Ms: r.p50Ms === undefined ? undefined : Number(r.p50Ms),
              p99Ms: r.p99Ms === undefined ? undefined : Number(r.p99Ms),
            },
          ]
        : [],
    );
  });
}

// What waking the relays costs the transactions that write events (bench/outbox-notify.ts).
if (wanted("outbox-notify")) {
  const group = "Outbox writers: a payment and an event per transaction";
  await optionalBench("outbox-notify", group, (value) => {
    const tps = (value as { tps?: Record<string, number> } | undefined)?.tps;
    if (!tps) return [];
    const row = (scenario: string, throughput: number | undefined): BenchResult[] =>
      typeof throughput === "number" ? [{ group, scenario, throughput, unit: "tx/s" }] : [];
    return [
      ...row("NOTIFY inside each transaction", tps.inside),
      ...row("NOTIFY after commit, shared", tps.after),
      ...row("no NOTIFY (relays only poll)", tps.none),
    ];
  });
}

// Inbound webhooks: verified and deduplicated deliveries against a bare verifying handler (bench/webhooks.ts).
if (wanted("webhooks")) {
  const group = "Inbound webhooks: verified and deduplicated deliveries";
  await optionalBench("webhooks", group, (value) => {
    const rate = (value as { rate?: Record<string, number> } | undefined)?.rate;
    if (!rate) return [];
    const row = (scenario: string, throughput: number | undefined): BenchResult[] =>
      typeof throughput === "number" ? [{ group, scenario, throughput, unit: "deliveries/s" }] : [];
    return [
      ...row("verify only (bare handler)", rate.verify),
      ...row("verify + INSERT, no dedup", rate.effect),
      ...row("idem: verify + inbox + INSERT", rate["idem-new"]),
      ...row("idem: redeliveries", rate["idem-redelivered"]),
    ];
  });
}

// --- Issue 63: a keyed MCP tool call against the bare tool (bench/mcp.ts) --------------------------------
if (wanted("mcp")) {
  const group = "MCP tool call: keyed (idem/mcp, atomic) against the bare tool, in memory";
  await optionalBench("mcp", group, (value) => {
    const r = value as { rows?: Array<Record<string, number | string>>; keyedRatio?: number } | undefined;
    if (!r?.rows) return [];
    if (typeof r.keyedRatio === "number") {
      figure(group, "keyed / bare", f2(r.keyedRatio), "median of rounds");
      const cpu = (s: string) => r.rows!.find((x) => x.scenario === s);
      const bare = cpu("bare");
      const keyed = cpu("keyed");
      if (bare && keyed) {
        figure(
          group,
          "CPU per call, bare / keyed",
          `node ${f0(Number(bare.nodeUsPerCall))} / ${f0(Number(keyed.nodeUsPerCall))} µs, PostgreSQL ${f0(Number(bare.postgresUsPerCall))} / ${f0(Number(keyed.postgresUsPerCall))} µs`,
        );
      }
      highlight(`MCP: a keyed tool call / the bare tool ${f2(r.keyedRatio)}`);
    }
    return r.rows.map((row) => ({
      group,
      scenario: String(row.scenario),
      throughput: Number(row.callsPerSecond),
      unit: "calls/s",
      note: `CPU per call: node ${f0(Number(row.nodeUsPerCall))} µs, PostgreSQL ${f0(Number(row.postgresUsPerCall))} µs`,
    }));
  });
}

// --- Issue 8: bytes per key (bench/keys.ts) ---------------------------------------------------------------
if (wanted("keys")) await optionalBench("keys", "Key storage: full and compact modes");
if (wanted("prepared")) {
  await optionalBench("prepared", "Named prepared statements against unnamed ones (what a pooler needs)");
}
if (wanted("pg-driver")) {
  await optionalBench("pg-driver", "node-postgres adapter: Node CPU per statement of the atomic path");
}

// --- Issue 13: encryption at rest (bench/sealing.ts) -----------------------------------------------------
if (wanted("sealing")) {
  const group = "Encryption at rest: atomic store, 1 KB replies, sealed vs clear";
  await optionalBench("sealing", group, (value) => {
    const store = (value as { store?: Record<string, { firstRps: number; replayRps: number }> })?.store ?? {};
    return Object.entries(store).flatMap(([mode, r]): BenchResult[] => [
      { group, scenario: `${mode}: keyed first-time`, throughput: r.firstRps, unit: "req/s" },
      { group, scenario: `${mode}: keyed replay`, throughput: r.replayRps, unit: "req/s" },
    ]);
  });
}

// --- Issue 32: what the OpenTelemetry instrumentation costs (bench/otel.ts) -------------------------------
if (wanted("otel")) {
  const group = "OpenTelemetry: keyed requests with no provider, a no-op one and the SDK";
  await optionalBench("otel", group, (value) => {
    const modes = (value as { modes?: Record<string, { firstRps: number; replayRps: number }> })?.modes ?? {};
    return Object.entries(modes).flatMap(([mode, r]): BenchResult[] => [
      { group, scenario: `${mode}: keyed first-time`, throughput: r.firstRps, unit: "req/s" },
      { group, scenario: `${mode}: keyed replay`, throughput: r.replayRps, unit: "req/s" },
    ]);
  });
}

// --- Issue 20: flat cost as keys, retention and partitions grow (bench/scale.ts) ---------------------------
if (wanted("scale")) {
  const group = "Scale: key count (atomic store, 16 workers)";
  await optionalBench("scale", group, (value) => {
    const sizes = (value as { sizes?: Record<string, any>[] })?.sizes ?? [];
    return sizes.flatMap((r): BenchResult[] =>
      (["first", "replay"] as const).map((kind) => ({
        group,
        scenario: `${kind === "first" ? "first-time" : "replay"} at ${f0(r.keys)} keys`,
        throughput: r[kind].rate,
        unit: "keys/s",
        p50Ms: r[kind].p50,
        p99Ms: r[kind].p99,
        note: `${r.missBuffers} buffers per miss, ${f0(r.bytesPerKey)} B and ${f0(r.walPerKey)} B of WAL per key`,
      })),
    );
  });
}

// --- Issue 28: a single-shard keyed transaction on Citus against plain PostgreSQL (bench/citus.ts) ---------
if (wanted("citus")) {
  const group = "Citus: keyed atomic requests, coordinator + 2 workers on this machine vs one plain node";
  process.env.DATABASE_URL ??= DATABASE_URL; // its plain node (test/helpers/db.ts reads it on import)
  await optionalBench("citus", group, (value) => {
    const v = value as {
      plain?: number;
      citus?: number;
      latency?: Record<string, { p50: number; p99: number }>;
    };
    if (v?.plain === undefined || v.citus === undefined || !v.latency) return [];
    const note = `16 concurrent, 64 tenants; Citus / plain ${f2(v.citus / v.plain)}`;
    return (["plain", "citus"] as const).map((k) => ({
      group,
      scenario: k === "plain" ? "plain PostgreSQL" : "Citus, through the coordinator",
      throughput: v[k]!,
      unit: "req/s",
      p50Ms: v.latency![k]!.p50,
      p99Ms: v.latency![k]!.p99,
      note: `${note}; p50/p99 of one request alone`,
    }));
  });
}

// --- Issue 62: idem/lambda's cold start and per-invocation cost, beside Powertools (bench/lambda.ts) -----
if (wanted("lambda")) {
  const group = "Lambda: cold start and per invocation";
  await optionalBench("lambda", group, (value) => {
    const warm = (value as { warm?: Record<string, { us: number; cpuUs: number }> })?.warm;
    if (!warm?.bare) return [];
    return Object.entries(warm).map(([scenario, w]) => ({
      group,
      scenario,
      throughput: 1e6 / w.us,
      unit: "invocations/s",
      note: `CPU ${w.cpuUs.toFixed(0)} us per invocation; throughput / bare ${(warm.bare!.us / w.us).toFixed(2)}, CPU / bare ${(w.cpuUs / warm.bare!.cpuUs).toFixed(2)}`,
    }));
  });
}

// --- Issue 33: bounded memory over a long run (bench/soak.ts), only when named ------------------------------
if (ONLY?.includes("soak")) {
  const group = "Soak: heap after GC over 1,000,000 events and keyed payments";
  await optionalBench(
    "soak",
    group,
    (value) =>
      Array.isArray(value)
        ? value.map((r: { name: string; rate: number; growthMB: number; bytesPer: number; n: number }) => ({
            group,
            scenario: `${r.name}: ${f0(r.n)} ${r.name.includes("service") ? "keyed payments" : "events end to end"}`,
            throughput: r.rate,
            unit: r.name.includes("service") ? "payments/s" : "events/s",
            note: `heap growth after GC from 10% to the end ${r.growthMB.toFixed(1)} MB (${r.bytesPer.toFixed(1)} B each)`,
          }))
        : [],
    6 * 3_600_000,
  );
}

// --- Retention: a day of keys, dropped or deleted ------------------------------------------------------
if (wanted("retention")) {
  const group = "Retention: one day partition of keys";
  console.log("");
  const r = await section(group, () => retentionBench());
  if (r) {
    printRetention(r);
    const n = f0(r.keys);
    const group2 = `${group} (${n} keys)`;
    const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;
    result({
      group: group2,
      scenario: "DETACH + DROP of the partition (store.sweep)",
      throughput: (r.keys / r.dropMs) * 1000,
      unit: "keys/s removed",
      note: `${r.dropMs.toFixed(0)} ms, WAL ${mib(r.dropWalBytes)}`,
    });
    result({
      group: group2,
      scenario: "DELETE WHERE created_at < …, then VACUUM",
      throughput: (r.keys / (r.deleteMs + r.vacuumMs)) * 1000,
      unit: "keys/s removed",
      note: `${r.deleteMs.toFixed(0)} + ${r.vacuumMs.toFixed(0)} ms, WAL ${mib(r.deleteWalBytes + r.vacuumWalBytes)}`,
    });
    figure(
      group2,
      "size per stored key",
      `${f0(r.bytesPerKey)} bytes`,
      `heap ${f0(r.heapBytesPerKey)}, primary key index ${f0(r.indexBytesPerKey)}, TOAST ${f0(r.toastBytesPerKey)}; ${mib(r.partitionBytes)} per partition`,
    );
    figure(
      group2,
      "DETACH CONCURRENTLY + DROP of the partition",
      `${r.dropMs.toFixed(1)} ms`,
      `WAL ${mib(r.dropWalBytes)}`,
    );
    figure(
      group2,
      "DELETE … WHERE created_at < cutoff",
      `${r.deleteMs.toFixed(0)} ms`,
      `WAL ${mib(r.deleteWalBytes)}; ${f0(r.deadTuples)} dead tuples, ${mib(r.bytesAfterDelete)} still on disk`,
    );
    figure(
      group2,
      "+ the VACUUM it needs",
      `${r.vacuumMs.toFixed(0)} ms`,
      `WAL ${mib(r.vacuumWalBytes)}; ${mib(r.bytesAfterVacuum)} left (indexes do not shrink)`,
    );
    highlight(
      `A stored key costs ${f0(r.bytesPerKey)} bytes; dropping a day of ${n} keys takes ${f0(r.dropMs)} ms, deleting them ${f0(r.deleteMs)} ms + ${f0(r.vacuumMs)} ms of VACUUM (${mib(r.deleteWalBytes + r.vacuumWalBytes)} of WAL vs ${mib(r.dropWalBytes)})`,
    );
    figure(
      group2,
      "delete + vacuum / drop",
      `${f0((r.deleteMs + r.vacuumMs) / r.dropMs)}× the time`,
      `${f0((r.deleteWalBytes + r.vacuumWalBytes) / Math.max(1, r.dropWalBytes))}× the WAL`,
    );
  }
}

report.seconds = (performance.now() - started) / 1000;
const whole = ONLY ? withPrevious(report) : report;
const written = writeReport(whole);
// The README's one table of figures, from the report just written (bench/readme.ts).
const readme = writeReadmeFigures(whole);
console.log(
  `\nreport: ${relative(process.cwd(), written.markdown)}, ${relative(process.cwd(), written.svg)}` +
    (readme ? "; README.md's figures rewritten" : "") +
    (report.failures.length ? ` (${report.failures.length} benchmark(s) not measured)` : ""),
);
// Brokers' and pools' sockets may linger in benchmarks of other issues: the report is written, stop.
process.exit(report.failures.length ? 1 : 0);
