/**
 * The benchmark report: `npm run bench` hands every figure it measured to `writeReport`, which writes
 * `bench/results/latest.md` (a Markdown table per group, with the machine it ran on),
 * `bench/results/latest.svg` (a bar chart of throughput per scenario, p99 beside each bar) and, when the
 * comparison with a bare handler and the peers ran, `bench/results/compare.svg`. The SVGs are written
 * by hand: no charting dependency. A run of some benchmarks only (`--only`) keeps the others' figures
 * from the previous report.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import os from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { addChaosSummary } from "./chaos-summary.ts";
import { compareMarkdown, compareSvg } from "./compare/render.ts";
import type { Machine, Report } from "./report-types.ts";

export const RESULTS_DIR = join(dirname(fileURLToPath(import.meta.url)), "results");

/** The machine: CPU model and count, memory, OS, Node, and the PostgreSQL server's version. */
export async function describeMachine(databaseUrl: string): Promise<Machine> {
  let postgres = "unknown";
  const c = new pg.Client({ connectionString: databaseUrl });
  try {
    await c.connect();
    postgres = String((await c.query("SHOW server_version")).rows[0].server_version);
  } catch (err) {
    postgres = `unreachable (${(err as Error).message})`;
  } finally {
    await c.end().catch(() => {});
  }
  const cpus = os.cpus();
  return {
    cpu: cpus[0]?.model.trim() ?? "unknown",
    cores: cpus.length,
    memoryGiB: Math.round((os.totalmem() / 2 ** 30) * 10) / 10,
    os: `${os.type()} ${os.release()} ${os.arch()}`,
    load: Math.round(os.loadavg()[0]! * 10) / 10,
    node: process.version,
    postgres,
    date: new Date().toISOString().replace(/\.\d+Z$/, "Z"),
  };
}

function fmt(n: number | undefined, digits = 0): string {
  if (n === undefined || !Number.isFinite(n)) return "";
  return n.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

function ms(n: number | undefined): string {
  if (n === undefined || !Number.isFinite(n)) return "";
  return n < 10 ? fmt(n, 2) : n < 100 ? fmt(n, 1) : fmt(n);
}

const cell = (s: string) => s.replaceAll("|", "\\|").replaceAll("\n", " ");

function groupsOf(report: Report): string[] {
  const seen: string[] = [];
  const add = (g: string) => {
    if (!seen.includes(g)) seen.push(g);
  };
  for (const r of report.results) add(r.group);
  for (const f of report.figures) add(f.group);
  for (const n of report.notes) add(n.group);
  for (const f of report.failures) add(f.group);
  return seen;
}

export function renderMarkdown(report: Report): string {
  const m = report.machine;
  const out: string[] = [
    "# idem benchmarks",
    "",
    `Measured ${m.date} by \`npm run bench\`${report.seconds ? ` in ${fmt(report.seconds)} s` : ""}. ` +
      "Compare figures from the same run with each other (ratios), not with another machine's.",
    "",
    "| machine | |",
    "|---|---|",
    `| CPU | ${cell(m.cpu)} × ${m.cores} |`,
    `| memory | ${m.memoryGiB} GiB |`,
    `| OS | ${cell(m.os)} |`,
    `| load average at start | ${m.load} (1 min) |`,
    `| Node.js | ${m.node} |`,
    `| PostgreSQL | ${cell(m.postgres)} |`,
    "",
    ...(report.carried?.length
      ? [
          `Not run this time, kept from earlier runs: ${report.carried.map((c) => `${c.group} (${c.date})`).join("; ")}.`,
          "",
        ]
      : []),
    ...(report.highlights?.length ? [...report.highlights.map((h) => `- ${h}`), ""] : []),
    ...(report.comparison ? ["![idem and its peers against a bare handler](compare.svg)", ""] : []),
    "![throughput and p99 per scenario](latest.svg)",
    "",
  ];
  if (report.comparison)
    out.push(`## ${report.comparison.group}`, "", ...compareMarkdown(report.comparison.data), "");
  for (const group of groupsOf(report)) {
    out.push(`## ${group}`, "");
    const rows = report.results.filter((r) => r.group === group);
    if (rows.length) {
      out.push("| scenario | throughput | p50 ms | p99 ms | note |", "|---|---:|---:|---:|---|");
      for (const r of rows) {
        out.push(
          `| ${cell(r.scenario)} | ${fmt(r.throughput)} ${r.unit} | ${ms(r.p50Ms)} | ${ms(r.p99Ms)} | ${cell(r.note ?? "")} |`,
        );
      }
      out.push("");
    }
    const figures = report.figures.filter((f) => f.group === group);
    if (figures.length) {
      out.push("| figure | value | note |", "|---|---:|---|");
      for (const f of figures) out.push(`| ${cell(f.name)} | ${cell(f.value)} | ${cell(f.note ?? "")} |`);
      out.push("");
    }
    for (const n of report.notes.filter((x) => x.group === group)) {
      // Printed Markdown tables stay tables; every other printed line goes in a code block.
      let i = 0;
      while (i < n.lines.length) {
        const table = n.lines[i]!.startsWith("|");
        const block: string[] = [];
        while (i < n.lines.length && n.lines[i]!.startsWith("|") === table) block.push(n.lines[i++]!);
        out.push(...(table ? block : ["```", ...block, "```"]), "");
      }
    }
    for (const f of report.failures.filter((x) => x.group === group)) {
      out.push(`**Not measured in this run:** ${cell(f.error)}`, "");
    }
  }
  return `${out.join("\n").trimEnd()}\n`;
}

const esc = (s: string) =>
  s.replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;").replaceAll('"', "&quot;");

/**
 * A horizontal bar chart: one panel per group (each with its own scale, since units differ), one bar
 * per scenario, the throughput at the bar's end and the p99 latency in the right-hand column.
 */
export function renderSvg(report: Report): string {
  const W = 960;
  const LABEL_W = 330;
  const P99_W = 110;
  const BAR_MAX = W - LABEL_W - P99_W - 180;
  const ROW_H = 26;
  const GROUP_GAP = 22;
  const HEADER_H = 26;
  const palette = ["#3b6ea5", "#d1793a", "#4f9a62", "#8c5fa8", "#b8534f", "#5a8f95", "#9a8a3c"];
  const groups = groupsOf(report).filter((g) => report.results.some((r) => r.group === g));

  const parts: string[] = [];
  let y = 64;
  groups.forEach((group, gi) => {
    const rows = report.results.filter((r) => r.group === group);
    const max = Math.max(...rows.map((r) => r.throughput), 1);
    const units = [...new Set(rows.map((r) => r.unit))].join(", ");
    const color = palette[gi % palette.length]!;
    parts.push(
      `<text x="16" y="${y + 16}" class="group">${esc(group)}</text>`,
      `<text x="${W - 16}" y="${y + 16}" class="axis" text-anchor="end">${esc(units)}${gi === 0 ? " · p99" : ""}</text>`,
    );
    y += HEADER_H;
    for (const r of rows) {
      const w = Math.max(2, (r.throughput / max) * BAR_MAX);
      const cy = y + ROW_H / 2;
      parts.push(
        `<text x="${LABEL_W - 10}" y="${cy + 4}" class="label" text-anchor="end">${esc(truncate(r.scenario, 48))}</text>`,
        `<rect x="${LABEL_W}" y="${y + 4}" width="${w.toFixed(1)}" height="${ROW_H - 8}" rx="3" fill="${color}"><title>${esc(
          `${r.scenario}: ${fmt(r.throughput)} ${r.unit}${r.p99Ms !== undefined ? `, p99 ${ms(r.p99Ms)} ms` : ""}`,
        )}</title></rect>`,
        `<text x="${LABEL_W + w + 6}" y="${cy + 4}" class="value">${esc(`${fmt(r.throughput)} ${r.unit}`)}</text>`,
        `<text x="${W - 16}" y="${cy + 4}" class="p99" text-anchor="end">${r.p99Ms !== undefined ? esc(`p99 ${ms(r.p99Ms)} ms`) : "–"}</text>`,
      );
      y += ROW_H;
    }
    y += GROUP_GAP;
  });
  for (const h of report.highlights ?? []) {
    parts.push(`<text x="16" y="${y + 4}" class="label">• ${esc(h)}</text>`);
    y += 20;
  }
  const m = report.machine;
  const footer = `${m.cpu} × ${m.cores}, ${m.memoryGiB} GiB, Node ${m.node}, PostgreSQL ${m.postgres} · ${m.date}`;
  const H = y + 34;
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="-apple-system, 'Segoe UI', Helvetica, Arial, sans-serif">
<style>
  .title { font-size: 18px; font-weight: 600; fill: #1f2328; }
  .sub { font-size: 12px; fill: #59636e; }
  .group { font-size: 14px; font-weight: 600; fill: #1f2328; }
  .label { font-size: 12px; fill: #1f2328; }
  .value { font-size: 12px; fill: #1f2328; font-variant-numeric: tabular-nums; }
  .p99 { font-size: 12px; fill: #59636e; font-variant-numeric: tabular-nums; }
  .axis { font-size: 11px; fill: #59636e; }
</style>
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="16" y="28" class="title">idem benchmarks: throughput per scenario (bars), p99 latency (right)</text>
<text x="16" y="48" class="sub">${esc(footer)}</text>
${parts.join("\n")}
<text x="16" y="${H - 10}" class="axis">Each panel has its own scale. Figures from one run on one machine: compare within the run.</text>
</svg>
`;
}

function truncate(s: string, n: number): string {
  return s.length <= n ? s : `${s.slice(0, n - 1)}…`;
}

/**
 * Write `latest.md`, `latest.svg` and the raw `latest.json` under `dir` (default bench/results); returns
 * the first two paths.
 */
export function writeReport(report: Report, dir = RESULTS_DIR): { markdown: string; svg: string } {
  mkdirSync(dir, { recursive: true });
  addChaosSummary(report, dir); // the chaos suite's last figures, when it left them here
  const markdown = join(dir, "latest.md");
  const svg = join(dir, "latest.svg");
  writeFileSync(markdown, renderMarkdown(report));
  writeFileSync(svg, renderSvg(report));
  if (report.comparison) {
    const m = report.comparison.machine ?? report.machine; // a comparison kept from an earlier run has its own
    const footer = `${m.cpu} × ${m.cores}, Node ${m.node}, PostgreSQL ${m.postgres}, load ${m.load} at start · ${m.date}`;
    writeFileSync(join(dir, "compare.svg"), compareSvg(report.comparison.data, footer));
  }
  writeFileSync(join(dir, "latest.json"), `${JSON.stringify(report, null, 2)}\n`);
  return { markdown, svg };
}

/**
 * This run's report with what the previous one (`latest.json` in `dir`) measured in groups this run did
 * not run: a run of one benchmark does not erase the others' figures.
 */
export function withPrevious(report: Report, dir = RESULTS_DIR): Report {
  const file = join(dir, "latest.json");
  if (!existsSync(file)) return report;
  let prev: Report;
  try {
    prev = JSON.parse(readFileSync(file, "utf8")) as Report;
  } catch {
    return report;
  }
  const ran = new Set(groupsOf(report));
  if (report.comparison) ran.add(report.comparison.group);
  const keep = <T extends { group: string }>(xs: T[] | undefined) =>
    (xs ?? []).filter((x) => !ran.has(x.group));
  const carried = [...groupsOf(prev), ...(prev.comparison ? [prev.comparison.group] : [])]
    .filter((group) => !ran.has(group))
    .map((group) => ({
      group,
      date: prev.carried?.find((c) => c.group === group)?.date ?? prev.machine.date,
    }));
  if (!carried.length) return report;
  // A highlight begins with its subject ("HTTP: ..."): this run's replace the previous ones on the same subject.
  const subject = (h: string) => h.split(":")[0];
  const fresh = new Set((report.highlights ?? []).map(subject));
  return {
    ...report,
    results: [...keep(prev.results), ...report.results],
    figures: [...keep(prev.figures), ...report.figures],
    notes: [...keep(prev.notes), ...report.notes],
    failures: [...keep(prev.failures), ...report.failures],
    highlights: [
      ...(prev.highlights ?? []).filter((h) => !fresh.has(subject(h))),
      ...(report.highlights ?? []),
    ],
    comparison:
      report.comparison ?? (prev.comparison && !ran.has(prev.comparison.group) ? prev.comparison : undefined),
    carried,
  };
}
