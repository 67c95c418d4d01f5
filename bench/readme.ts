/**
 * The README's figures: one table, between `<!-- bench-figures -->` and `<!-- /bench-figures -->`,
 * rendered from a benchmark report. `npm run bench` writes it after every run (bench/run.ts), from the
 * report it just wrote; `npx tsx bench/readme.ts` renders it again from bench/results/latest.json
 * without measuring anything. Every figure in it is a ratio or a size measured within one run, with the
 * CPU per request, event or payment beside it where the benchmark measured it.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { CompareRow, ModeStats, Ratio } from "./compare/index.ts";
import type { Report } from "./report-types.ts";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
export const README = join(ROOT, "README.md");
const BLOCK = /<!-- bench-figures -->[\s\S]*?<!-- \/bench-figures -->/;

const f0 = (n: number) => n.toLocaleString("en-US", { maximumFractionDigits: 0 });
const f2 = (n: number) => n.toFixed(2);
const day = (iso: string) => iso.slice(0, 10);
const ratio = (r: Ratio | undefined) => (r ? `${f2(r.median)} (${f2(r.min)}–${f2(r.max)})` : "");
const us = (m: (Pick<ModeStats, "nodeUs" | "postgresUs"> & { redisUs?: number }) | undefined) =>
  m
    ? `${f0(m.nodeUs)} + ${f0(m.postgresUs)}${(m.redisUs ?? 0) >= 1 ? ` + ${f0(m.redisUs!)} Redis` : ""}`
    : "?";

/** The Redis server's CPU counts for the peers only (for the others it is whatever else uses Redis). */
const peerCpu = (r: CompareRow, m: ModeStats | undefined) =>
  m && r.kind !== "peer" ? { ...m, redisUs: 0 } : m;

interface Row {
  what: string;
  figure: string;
  cpu: string;
  date: string;
}

/** The date a group of the report was measured: its own run, or the earlier one it was carried from. */
function dateOf(report: Report, group: string): string {
  return day(report.carried?.find((c) => c.group === group)?.date ?? report.machine.date);
}

function comparisonRows(report: Report): Row[] {
  const c = report.comparison;
  if (!c) return [];
  const date = day(c.machine?.date ?? report.machine.date);
  const bareOf = (r: CompareRow) =>
    c.data.rows.find((x) => x.kind === "bare" && x.framework === r.framework)?.modes.bare;
  const rows: Row[] = [];
  for (const r of c.data.rows.filter((x) => x.kind === "idem" || x.kind === "peer")) {
    const yardstick =
      r.yardstick === "hand-cte" ? "hand-written single statement" : "hand-written transaction";
    const hand = r.handRatio ? ` · keyed / ${yardstick} (prepared) ${ratio(r.handRatio)}` : "";
    const handCpu = r.handCpu
      ? ` · keyed beside the ${yardstick}: ${us(r.handCpu.idem)} against ${us(r.handCpu.hand)}`
      : "";
    rows.push({
      what: `${r.label} against a bare handler (wrk, ${c.data.settings.connections} connections)`,
      figure: `keyed ${ratio(r.keyedRatio)} · replay ${ratio(r.replayRatio)}${hand}`,
      cpu: `keyed ${us(peerCpu(r, r.modes.keyed))} · replay ${us(peerCpu(r, r.modes.replay))} · bare ${us(peerCpu(r, bareOf(r)))}${handCpu} µs (server + PostgreSQL${r.kind === "peer" ? " + Redis" : ""})`,
      date,
    });
  }
  return rows;
}

function figure(report: Report, group: string, name: string): string | undefined {
  return report.figures.find((f) => f.group === group && f.name === name)?.value;
}

function throughput(report: Report, group: string, scenario: string): number | undefined {
  return report.results.find((r) => r.group === group && r.scenario === scenario)?.throughput;
}

function otherRows(report: Report): Row[] {
  const rows: Row[] = [];
  const http = "Payment endpoint over HTTP (atomic mode, autocannon, 32 connections)";
  const first = figure(report, http, "keyed first-time / unkeyed");
  const replay = figure(report, http, "keyed replay / unkeyed");
  if (first && replay)
    rows.push({
      what: "The reference service's payment endpoint, keyed / unkeyed (autocannon, 32 connections)",
      figure: `first-time ${first} · replay ${replay}`,
      cpu: "not measured by this benchmark",
      date: dateOf(report, http),
    });
  const client = "Client overhead on the success path (loopback)";
  const overFetch = figure(report, client, "client time / fetch time (median of rounds)");
  if (overFetch)
    rows.push({
      what: "idem's client / plain fetch, success path",
      figure: overFetch,
      cpu: `CPU time, client / fetch: ${figure(report, client, "CPU-time ratio") ?? "?"}`,
      date: dateOf(report, client),
    });
  const phases = "Phases mode (provider over HTTP) vs atomic mode (library level)";
  const phasesRatio = figure(report, phases, "phases / atomic");
  if (phasesRatio)
    rows.push({
      what: "Phases mode (a provider call per payment) / atomic mode",
      figure: phasesRatio,
      cpu:
        `per payment, atomic / phases: runner ${figure(report, phases, "CPU per payment in the runner's process") ?? "?"}, ` +
        `PostgreSQL ${figure(report, phases, "CPU per payment in PostgreSQL") ?? "?"}`,
      date: dateOf(report, phases),
    });
  const messaging = "Messaging: outbox -> broker -> inbox";
  for (const broker of ["RabbitMQ", "NATS JetStream"]) {
    const perMessage = throughput(report, messaging, `${broker}: end to end, effect per message`);
    const perBatch = throughput(report, messaging, `${broker}: end to end, effect per batch`);
    const ordered = throughput(
      report,
      messaging,
      `${broker}: ordered backlog of 10,000 over 40 aggregates, pipelined`,
    );
    if (perMessage && perBatch)
      rows.push({
        what: `${broker}: outbox -> relay -> broker -> inbox -> effect, events/s`,
        figure:
          `${f0(perMessage)} (effect per message) · ${f0(perBatch)} (per batch)` +
          (ordered ? ` · ordered, pipelined ${f0(ordered)} (${f2(ordered / perBatch)} of per batch)` : ""),
        cpu: "not measured by this benchmark",
        date: dateOf(report, messaging),
      });
  }
  const writers = "Outbox writers: a payment and an event per transaction";
  const inside = throughput(report, writers, "NOTIFY inside each transaction");
  const after = throughput(report, writers, "NOTIFY after commit, shared");
  const none = throughput(report, writers, "no NOTIFY (relays only poll)");
  if (inside && after && none)
    rows.push({
      what: "Outbox writers' transactions/s, with the relay's wake-up / without",
      figure: `NOTIFY after commit ${f2(after / none)} · inside the transaction ${f2(inside / none)}`,
      cpu: "not measured by this benchmark",
      date: dateOf(report, writers),
    });
  const retention = "Retention: one day partition of keys (1,000,000 keys)";
  const size = figure(report, retention, "size per stored key");
  const drop = figure(report, retention, "DETACH CONCURRENTLY + DROP of the partition");
  const slower = figure(report, retention, "delete + vacuum / drop");
  if (size && drop)
    rows.push({
      what: "A day of 1,000,000 keys: bytes per key; dropping its partition",
      figure: `${size} · ${drop}${slower ? ` (DELETE + VACUUM: ${slower})` : ""}`,
      cpu: "",
      date: dateOf(report, retention),
    });
  return rows;
}

/** The README's block: the run's description and one table. */
export function readmeFigures(report: Report): string {
  const m = report.machine;
  const rows = [...comparisonRows(report), ...otherRows(report)];
  const cell = (s: string) => s.replaceAll("|", "\\|");
  return [
    "<!-- bench-figures -->",
    `<!-- Written by \`npm run bench\` (bench/readme.ts) from bench/results/latest.json: do not edit by hand. -->`,
    "",
    `Measured by \`npm run bench\` on ${day(m.date)} (${m.cpu} × ${m.cores}, ${m.memoryGiB} GiB, load ${m.load} at the ` +
      `start, Node ${m.node}, PostgreSQL ${m.postgres.split(" ")[0]}); a row measured in an earlier run gives its ` +
      "date. Ratios are within one run; CPU is per request, event or payment. The full report: " +
      "[bench/results/latest.md](bench/results/latest.md).",
    "",
    "| what | ratio or figure | CPU per unit | run |",
    "|---|---|---|---|",
    ...rows.map((r) => `| ${cell(r.what)} | ${cell(r.figure)} | ${cell(r.cpu)} | ${r.date} |`),
    "<!-- /bench-figures -->",
  ].join("\n");
}

/** Write the block into the README (which must hold one). Returns whether the README changed. */
export function writeReadmeFigures(report: Report, path = README): boolean {
  const text = readFileSync(path, "utf8");
  if (!BLOCK.test(text)) throw new Error(`${path} has no <!-- bench-figures --> block`);
  const next = text.replace(BLOCK, readmeFigures(report));
  if (next === text) return false;
  writeFileSync(path, next);
  return true;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const report = JSON.parse(readFileSync(join(ROOT, "bench/results/latest.json"), "utf8")) as Report;
  console.log(writeReadmeFigures(report) ? "README.md: figures rewritten" : "README.md: figures unchanged");
}
