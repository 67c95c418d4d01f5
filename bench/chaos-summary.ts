/**
 * The chaos suite's figures in the benchmark report (issue 14). The suite (test/chaos/chaos.test.ts)
 * writes `bench/results/chaos.json` after each run: how many intents, sent with the client's default
 * options, ended with a definite answer within their deadline, and how many after `resume()`, with
 * exactly one charge each. When that file is there, `writeReport` shows its two lines among the
 * highlights and as figures of their own group, with the date of the run they come from.
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { Report } from "./report.ts";

export const CHAOS_GROUP = "Chaos suite (client defaults)";

/** What the chaos suite writes (only the fields read here). */
export interface ChaosSummary {
  date: string;
  seed: number;
  clients: string;
  intents: number;
  definiteInDeadline: number;
  definiteAfterResume: number;
  paid: number;
  paidExactlyOnce: number;
  /** The two printed lines: definite within the deadline, and after resume. */
  lines: [string, string];
}

/** The last chaos run's summary in `dir`, or `undefined` when there is none (or it is unreadable). */
export function readChaosSummary(dir: string): ChaosSummary | undefined {
  const file = join(dir, "chaos.json");
  if (!existsSync(file)) return undefined;
  try {
    const s = JSON.parse(readFileSync(file, "utf8")) as ChaosSummary;
    return Array.isArray(s.lines) && s.lines.length === 2 ? s : undefined;
  } catch {
    return undefined;
  }
}

/** Add the chaos suite's two figures to `report` when a summary is in `dir`. */
export function addChaosSummary(report: Report, dir: string): void {
  const s = readChaosSummary(dir);
  if (!s || report.figures.some((f) => f.group === CHAOS_GROUP)) return;
  const from = `chaos suite run of ${s.date.replace(/\.\d+Z$/, "Z")}, seed ${s.seed}, ${s.clients} clients`;
  const [definite, resumed] = s.lines;
  const pct = ((100 * s.definiteInDeadline) / s.intents).toFixed(1);
  const once =
    s.paidExactlyOnce === s.paid
      ? "each paid one charged once"
      : `${s.paidExactlyOnce} of ${s.paid} paid charged once`;
  report.highlights = [
    ...(report.highlights ?? []),
    `Chaos, client defaults: ${pct}% definite within the deadline, ${s.definiteAfterResume} of ${s.intents} after resume(), ${once}`,
  ];
  report.figures.push(
    { group: CHAOS_GROUP, name: "definite answers within the deadline", value: definite, note: from },
    { group: CHAOS_GROUP, name: "after resume()", value: resumed, note: from },
  );
}
