/**
 * The chaos suite's figures in the benchmark report (issue 14). The suite (test/chaos/chaos.slow.test.ts)
 * writes `bench/results/chaos.json` after each run: how many intents, sent with the client's default
 * options, ended with a definite answer within their deadline, and how many after `resume()`, with
 * exactly one charge each. When that file is there, `writeReport` shows its two lines among the
 * highlights and as figures of their own group, with the date of the run they come from.
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { Report } from "./report-types.ts";

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
}

/** The last chaos run's summary in `dir`, or `undefined` when there is none (or it is unreadable). */
export function readChaosSummary(dir: string): ChaosSummary | undefined {
  const file = join(dir, "chaos.json");
  if (!existsSync(file)) return undefined;
  try {
    const s = JSON.parse(readFileSync(file, "utf8")) as ChaosSummary;
    return typeof s.intents === "number" && typeof s.definiteInDeadline === "number" ? s : undefined;
  } catch {
    return undefined;
  }
}

/** A share as a percentage, rounded down (98.95% reads 98.9%, never 99.0%). */
const pct = (n: number, of: number) => `${(Math.floor((1000 * n) / Math.max(1, of)) / 10).toFixed(1)}%`;

/** Add the chaos suite's two figures to `report` when a summary is in `dir`. */
export function addChaosSummary(report: Report, dir: string): void {
  const s = readChaosSummary(dir);
  if (!s || report.figures.some((f) => f.group === CHAOS_GROUP)) return;
  const from = `chaos suite run of ${s.date.replace(/\.\d+Z$/, "Z")}, seed ${s.seed}, ${s.clients} client(s)`;
  const definite = `${s.definiteInDeadline} of ${s.intents} (${pct(s.definiteInDeadline, s.intents)})`;
  const once =
    s.paidExactlyOnce === s.paid
      ? "exactly one for all"
      : `exactly one for ${s.paidExactlyOnce} of ${s.paid} paid`;
  const resumed = `${s.definiteAfterResume} of ${s.intents} definite, charges per intent: ${once}`;
  const onceShort =
    s.paidExactlyOnce === s.paid ? "one charge each" : `${s.paid - s.paidExactlyOnce} paid NOT charged once`;
  report.highlights = [
    ...(report.highlights ?? []),
    `Chaos suite, client defaults: ${pct(s.definiteInDeadline, s.intents)} definite within the deadline; ${pct(s.definiteAfterResume, s.intents)} after resume(), ${onceShort}`,
  ];
  report.figures.push(
    { group: CHAOS_GROUP, name: "definite answers within the deadline", value: definite, note: from },
    { group: CHAOS_GROUP, name: "after resume()", value: resumed, note: from },
  );
}
