/**
 * The comparison in the report: Markdown tables for bench/results/latest.md and a chart of its own,
 * bench/results/compare.svg (written by bench/report.ts; the README shows it). Hand-written SVG, like
 * latest.svg.
 */
import type { CompareRow, Comparison, ModeStats, Ratio } from "./index.ts";
import { POWERTOOLS_REMAINING_MS } from "./variants.ts";

const f0 = (n: number) => n.toLocaleString("en-US", { maximumFractionDigits: 0 });
const f2 = (n: number) => n.toFixed(2);
const ms = (n: number) => (n < 10 ? n.toFixed(2) : n < 100 ? n.toFixed(1) : f0(n));
const cell = (s: string) => s.replaceAll("|", "\\|");
const ratioCell = (r: Ratio | undefined, rounds: number) =>
  r ? `**${f2(r.median)}**${rounds > 1 ? ` (${f2(r.min)}–${f2(r.max)})` : ""}` : "";

export function compareMarkdown(c: Comparison): string[] {
  const s = c.settings;
  const out = [
    `Each variant is a server in a child process on 127.0.0.1 (pg pool of ${s.poolSize}); wrk runs in another ` +
      `process, ${s.connections} connections, and loads one server at a time in ${s.sliceSeconds} s slices: per ` +
      "keyed variant, the bare handler of its framework, keyed first-time, replay (over all replay keys) and one hot key replayed by every connection in adjacent slices, over " +
      `${s.rounds} round${s.rounds > 1 ? "s" : ""}${s.quick ? " (--quick)" : ""}, after ${s.warmupSeconds ?? 3} s of load on each server ` +
      "(a server's first seconds under load are its slowest). " +
      `idem runs ${s.idemFrom === "source" ? "from its TypeScript sources (BENCH_SOURCE=1)" : "from its built package, as users run it"}. The handler is one INSERT; ` +
      "**bare** is that handler with no middleware, autocommitted. idem's routes set `effectsInTxOnly` (the " +
      "INSERT is the handler's only effect, so it is sent with the key's claim), and a replay of a key the " +
      "server saw finished is one autocommitted read. Each ratio is to the adjacent bare slice: " +
      "median (lowest–highest round). **hand-tx** and **hand-cte** are keyed handlers written by hand " +
      "(bench/compare/hand.ts: a pipelined transaction claiming the key with ON CONFLICT DO NOTHING, on each " +
      "framework, and one autocommitted statement on node:http), without idem's fingerprint, retention or " +
      "bounded waits; keyed / hand-written is idem's keyed first-time throughput over that of a keyed slice of " +
      "hand-tx on the same framework (hand-cte for single-statement mode) run beside it. The bare handlers, " +
      "the hand-written variants and the peers send their statements named (prepared once per connection), as " +
      "idem does (since issue 65; before, they were sent unnamed and PostgreSQL planned them on every request). " +
      `Measured in ${f0(c.seconds)} s.`,
    "",
    "| variant | keyed first-time / bare | keyed / hand-written | replay / bare | one hot key / bare | CPU µs per request, node + PostgreSQL: keyed · replay (/ bare) | CPU µs per keyed request beside the hand-written slices: idem · hand-written | runs each key once under 50 concurrent | survives a crash |",
    "|---|---:|---:|---:|---:|---:|---:|---|---|",
  ];
  for (const r of c.rows.filter((x) => x.kind !== "bare" || x.sameKeyVerdict)) {
    const bare = r.kind === "bare";
    const base = c.rows.find((x) => x.kind === "bare" && x.framework === r.framework)?.modes.bare;
    const cpu = (m: ModeStats | undefined) =>
      m && base ? `${cpuUs(m, r.kind === "peer")} (${f2(cpuOf(m) / cpuOf(base))})` : "";
    const handCell =
      r.kind === "hand"
        ? "1 (reference)"
        : r.handRatio
          ? `${ratioCell(r.handRatio, s.rounds)}${r.yardstick === "hand-cte" ? " (/ hand-cte)" : ""}`
          : "";
    const handCpu = r.handCpu ? `${cpuUs(r.handCpu.idem)} · ${cpuUs(r.handCpu.hand)}` : "";
    out.push(
      `| ${cell(r.label)} | ${bare ? "1 (reference)" : ratioCell(r.keyedRatio, s.rounds)} | ${handCell} | ${bare ? "" : ratioCell(r.replayRatio, s.rounds)} | ${bare ? "" : ratioCell(r.hotRatio, s.rounds)} | ${bare ? (base ? cpuUs(base) : "") : `${cpu(r.modes.keyed)} · ${cpu(r.modes.replay)}`} | ${handCpu} | ${cell(r.sameKeyVerdict ?? "not measured")} | ${cell(r.crashVerdict ?? "not measured")} |`,
    );
  }
  out.push(
    "",
    "Under 50 concurrent: 50 requests at once with one key, for each of " +
      `${c.rows.find((r) => r.sameKey)?.sameKey?.keys ?? "?"} keys; executions counted in the payments table. ` +
      "Crash: the server is killed (SIGKILL) right after the handler's INSERT returned (inside the key's " +
      "transaction with idem; already committed with the others), and the key is retried on a new instance of " +
      `the variant every 500 ms for up to ${s.crashWindowSeconds} s after the crash; executions counted in the ` +
      "table. The Powertools variant tells Powertools a request has " +
      `${POWERTOOLS_REMAINING_MS / 1000} s (a Lambda context's remaining time), ` +
      "and runs without payload validation: in 2.35.0 the cache layer drops the payload hash when it completes " +
      "a key, so with validation on every replay is answered 422.",
    "",
    `What the clients got under 50 concurrent (status × count; 0: no answer within 15 s): ${c.rows
      .filter((r) => r.sameKey)
      .map(
        (r) =>
          `${r.short} ${Object.entries(r.sameKey!.statuses)
            .map(([status, n]) => `${status}×${n}`)
            .join(", ")}`,
      )
      .join("; ")}.`,
    "",
    "| variant | mode | req/s (median, range) | p50 ms | p99 ms | node CPU µs/req | PostgreSQL CPU µs/req | Redis CPU µs/req | errors |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|",
  );
  for (const r of c.rows) {
    for (const [mode, m] of Object.entries(r.modes) as Array<[string, ModeStats]>) {
      const range = s.rounds > 1 ? ` (${f0(m.rpsMin)}–${f0(m.rpsMax)})` : "";
      out.push(
        `| ${cell(r.label)} | ${mode} | ${f0(m.rps)}${range} | ${ms(m.p50Ms)} | ${ms(m.p99Ms)} | ${f0(m.nodeUs)} | ${f0(m.postgresUs)} | ${r.kind === "peer" ? f0(m.redisUs) : ""} | ${m.errors || ""} |`,
      );
    }
  }
  out.push(
    "",
    "CPU per request from /proc: the server's process, the PostgreSQL backends of the bench's database (other " +
      "databases on the server are not counted), and the Redis server (shared with whatever else uses it). " +
      "CPU per request: node + PostgreSQL (+ Redis for the peers) µs, and in parentheses their sum over the bare " +
      "handler's on the same framework; beside keyed / hand-written, the CPU per keyed request of idem's slices " +
      "and of the hand-written slices paired with them. On a busy shared machine CPU per request is steadier " +
      "than throughput (about ±0.05 between runs, where throughput ratios swing ±0.2). Errors: connection errors, timeouts " +
      "and answers of 400 or more.",
  );
  return out;
}

/** CPU per request as `node + PostgreSQL` µs (and `+ Redis`, for the peers). */
const cpuUs = (m: { nodeUs: number; postgresUs: number; redisUs?: number }, redis = false) =>
  `${f0(m.nodeUs)} + ${f0(m.postgresUs)}${redis ? ` + ${f0(m.redisUs ?? 0)}` : ""}`;

/** CPU of one request, all processes counted (the server, PostgreSQL, Redis). */
const cpuOf = (m: ModeStats) => m.nodeUs + m.postgresUs + m.redisUs;

const esc = (s: string) =>
  s.replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;").replaceAll('"', "&quot;");

function verdictMark(v: string | undefined): { mark: string; color: string } {
  if (!v || v.startsWith("not measured")) return { mark: "–", color: "#59636e" };
  return v.startsWith("yes") ? { mark: "✓", color: "#1a7f37" } : { mark: "✗", color: "#cf222e" };
}

function shortVerdict(v: string | undefined): string {
  if (!v) return "not measured";
  return v.replace(/^(yes|no):? ?/, "").replace(/^\((.*)\)$/, "$1");
}

/**
 * Up to three bars per keyed variant (keyed first-time / bare; for idem, keyed / hand-tx on its framework or hand-cte;
 * replay / bare), a line at 1 (= bare, or hand-tx), and the two checks.
 */
export function compareSvg(c: Comparison, footer: string): string {
  const rows = c.rows.filter((r) => r.kind !== "bare");
  const W = 1100;
  const LABEL_W = 230;
  const BAR_W = 380;
  const CHECK_X = LABEL_W + BAR_W + 60;
  const ROW_H = 62;
  const top = 86;
  const max = Math.max(
    1.5,
    ...rows.flatMap((r) => [r.keyedRatio?.max ?? 0, r.handRatio?.max ?? 0, r.replayRatio?.max ?? 0]),
  );
  const x = (v: number) => LABEL_W + (v / max) * BAR_W;
  const parts: string[] = [];
  rows.forEach((r: CompareRow, i) => {
    const y = top + i * ROW_H;
    if (i > 0 && r.kind !== rows[i - 1]!.kind)
      parts.push(`<line x1="16" x2="${W - 16}" y1="${y - 3}" y2="${y - 3}" stroke="#d0d7de"/>`);
    parts.push(
      `<text x="${LABEL_W - 10}" y="${y + 17}" class="label" text-anchor="end">${esc(r.short)}</text>`,
      `<text x="${LABEL_W - 10}" y="${y + 32}" class="axis" text-anchor="end">${esc(r.kind === "idem" ? (r.name === "idem-statement" ? "single statement, node:http" : "atomic, pg pipeline") : r.kind === "hand" ? `by hand, ${r.framework === "node" ? "node:http" : r.framework}` : "Express, Redis")}</text>`,
    );
    for (const [j, ratio, color] of [
      [0, r.keyedRatio, KEYED],
      [1, r.kind === "hand" ? undefined : r.handRatio, HAND],
      [2, r.replayRatio, REPLAY],
    ] as const) {
      if (!ratio) continue;
      const by = y + 4 + j * 18;
      parts.push(
        `<rect x="${LABEL_W}" y="${by}" width="${Math.max(2, x(ratio.median) - LABEL_W).toFixed(1)}" height="15" rx="2" fill="${color}"/>`,
      );
      if (c.settings.rounds > 1)
        parts.push(
          `<line x1="${x(ratio.min).toFixed(1)}" x2="${x(ratio.max).toFixed(1)}" y1="${by + 7.5}" y2="${by + 7.5}" stroke="#1f2328" stroke-width="1.2"/>`,
        );
      parts.push(
        `<text x="${(x(ratio.max) + 6).toFixed(1)}" y="${by + 12}" class="value">${f2(ratio.median)}</text>`,
      );
    }
    for (const [j, v] of [r.sameKeyVerdict, r.crashVerdict].entries()) {
      const { mark, color } = verdictMark(v);
      const cx = CHECK_X + j * 190;
      parts.push(`<text x="${cx}" y="${y + 17}" class="mark" fill="${color}">${mark}</text>`);
      wrap(shortVerdict(v), 30, 2).forEach((line, k) => {
        parts.push(`<text x="${cx + 18}" y="${y + 16 + k * 14}" class="small">${esc(line)}</text>`);
      });
    }
  });
  const H = top + rows.length * ROW_H + 60;
  const one = x(1);
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="-apple-system, 'Segoe UI', Helvetica, Arial, sans-serif">
<style>
  .title { font-size: 18px; font-weight: 600; fill: #1f2328; }
  .sub { font-size: 12px; fill: #59636e; }
  .label { font-size: 13px; fill: #1f2328; }
  .value { font-size: 12px; fill: #1f2328; font-variant-numeric: tabular-nums; }
  .small { font-size: 11px; fill: #1f2328; }
  .mark { font-size: 15px; font-weight: 700; }
  .axis { font-size: 11px; fill: #59636e; }
</style>
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="16" y="28" class="title">Throughput relative to a bare handler (same framework, same run), and two correctness checks</text>
<text x="16" y="48" class="sub">${esc(footer)}</text>
<rect x="${LABEL_W}" y="60" width="12" height="10" fill="${KEYED}"/><text x="${LABEL_W + 16}" y="69" class="axis">keyed first-time / bare</text>
<rect x="${LABEL_W + 150}" y="60" width="12" height="10" fill="${HAND}"/><text x="${LABEL_W + 166}" y="69" class="axis">keyed / by hand</text>
<rect x="${LABEL_W + 265}" y="60" width="12" height="10" fill="${REPLAY}"/><text x="${LABEL_W + 281}" y="69" class="axis">replay / bare</text>
<text x="${CHECK_X}" y="69" class="axis">runs each key once (50 at once)</text>
<text x="${CHECK_X + 190}" y="69" class="axis">survives a crash (kill -9, retry)</text>
<line x1="${one.toFixed(1)}" x2="${one.toFixed(1)}" y1="${top - 6}" y2="${top + rows.length * ROW_H}" stroke="#59636e" stroke-dasharray="4 3"/>
<text x="${one.toFixed(1)}" y="${top + rows.length * ROW_H + 14}" class="axis" text-anchor="middle">1 = bare (hand-tx or hand-cte for the middle bar)</text>
${parts.join("\n")}
<text x="16" y="${H - 12}" class="axis">${esc(`wrk, ${c.settings.connections} connections, pg pool of ${c.settings.poolSize}; ${c.settings.rounds} round(s) of ${c.settings.sliceSeconds} s slices, interleaved; bar = median ratio, line = lowest to highest round.`)}</text>
</svg>
`;
}

/** The bars' colours: keyed / bare, keyed / hand-tx, replay / bare. */
const KEYED = "#3b6ea5";
const HAND = "#4c9a5b";
const REPLAY = "#d1793a";

/** Words in lines of at most `width` characters, at most `lines` of them (the last one cut with …). */
function wrap(text: string, width: number, lines: number): string[] {
  const out: string[] = [];
  let line = "";
  for (const word of text.split(" ")) {
    if (line && line.length + 1 + word.length > width) {
      out.push(line);
      line = word;
    } else line = line ? `${line} ${word}` : word;
  }
  if (line) out.push(line);
  if (out.length > lines)
    out.splice(
      lines - 1,
      out.length,
      `${out
        .slice(lines - 1)
        .join(" ")
        .slice(0, width - 1)}…`,
    );
  return out;
}
