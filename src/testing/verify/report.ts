/**
 * The report of a run: a plain object (what `--json` prints) and its text form, a summary table.
 */
import type { CheckResult, Violation, ViolationKind } from "./invariants.ts";
import type { VerifyDelivery, VerifyProbe } from "./plan.ts";
import type { ReplyFate } from "./proxy.ts";
import type { VerifyOutcome } from "./run.ts";

/** What {@link verify} found: the run's figures, each check's result and every violation. */
export interface VerifyReport {
  /** True when every invariant held. */
  ok: boolean;
  /** The API's base URL and the request verified. */
  target: { url: string; method: string; path: string };
  /** The seed of the run (the same seed plans the same intents and faults). */
  seed: number;
  /** Intents run. */
  intents: number;
  /** How long the run took, in milliseconds. */
  durationMs: number;
  /** Intents per delivery fault, and probes sent. */
  faults: Partial<Record<VerifyDelivery | "once" | VerifyProbe, number>>;
  /** Intents by how they ended. */
  outcomes: Record<VerifyOutcome, number>;
  /** What became of the server's replies in the fault proxy. */
  replies: Record<ReplyFate, number>;
  /** How effects were counted (null: not counted) and how many the run caused in all. */
  effects: { counter: string | null; counted: number };
  /** Each check's result (the summary table). */
  checks: CheckResult[];
  /** Violations counted by kind. */
  violationsByKind: Partial<Record<ViolationKind, number>>;
  /** Every violation seen. */
  violations: Violation[];
}

function table(rows: string[][], align: ("l" | "r")[]): string {
  const widths = rows[0]!.map((_, c) => Math.max(...rows.map((r) => r[c]!.length)));
  return rows
    .map((r) =>
      r
        .map((cell, c) => (align[c] === "r" ? cell.padStart(widths[c]!) : cell.padEnd(widths[c]!)))
        .join("  ")
        .trimEnd(),
    )
    .join("\n");
}

/** The human summary: what ran, a table of the checks, then the first violations. */
export function formatReport(report: VerifyReport, options: { examplesPerKind?: number } = {}): string {
  const perKind = options.examplesPerKind ?? 3;
  const faults = Object.entries(report.faults)
    .filter(([, v]) => v)
    .map(([k, v]) => `${k} ${v}`)
    .join(", ");
  const o = report.outcomes;
  const r = report.replies;
  const lines = [
    `idem verify: ${report.intents} intents, ${report.target.method} ${report.target.url}${report.target.path}, seed ${report.seed}, ${(report.durationMs / 1000).toFixed(1)} s`,
    `  faults: ${faults || "none"}`,
    `  outcomes: ${o.succeeded} succeeded, ${o.rejected} rejected, ${o.unresolved} unresolved; replies: ${r.relayed} relayed, ${r.dropped} dropped, ${r["timed-out"]} timed out`,
    `  effects: ${report.effects.counter ? `${report.effects.counted} counted by ${report.effects.counter}` : "not counted (no counter given)"}`,
    "",
    table(
      [
        ["invariant", "checked", "violations"],
        ...report.checks.map((c) => [c.name, c.checked ? String(c.checked) : "-", String(c.violations)]),
      ],
      ["l", "r", "r"],
    ),
    "",
  ];
  if (report.violations.length === 0) {
    lines.push("OK: every invariant held.");
  } else {
    const order = report.checks.flatMap((c) => c.kinds);
    const kinds = Object.entries(report.violationsByKind)
      .sort(([a], [b]) => order.indexOf(a as ViolationKind) - order.indexOf(b as ViolationKind))
      .map(([k, v]) => `${k} ${v}`)
      .join(", ");
    lines.push(`FAILED: ${report.violations.length} violation(s): ${kinds}`);
    // A few examples of each kind, in the order of the table.
    const kindsSeen = [...new Set(report.violations.map((v) => v.kind))].sort(
      (a, b) => order.indexOf(a) - order.indexOf(b),
    );
    let left = 0;
    for (const kind of kindsSeen) {
      const all = report.violations.filter((v) => v.kind === kind);
      for (const v of all.slice(0, perKind)) {
        lines.push(
          `  ${v.kind.padEnd(21)} ${v.intent >= 0 ? `intent ${v.intent} (key ${v.key})` : "run"}: ${v.message}`,
        );
      }
      left += Math.max(0, all.length - perKind);
    }
    if (left > 0) lines.push(`  … and ${left} more (--json lists them all)`);
  }
  return lines.join("\n");
}
