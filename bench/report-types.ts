/**
 * The shapes of a benchmark report, apart from the code that writes it (bench/report.ts), so that the
 * parts that add to a report (bench/chaos-summary.ts) need not import the writer.
 */
import type { Comparison } from "./compare/index.ts";

/** One measured scenario. */
export interface BenchResult {
  /** The benchmark it belongs to, e.g. "HTTP endpoint"; one table and one chart panel per group. */
  group: string;
  scenario: string;
  /** Higher is better; drawn as the bar. */
  throughput: number;
  /** e.g. "req/s", "payments/s", "events/s". */
  unit: string;
  p50Ms?: number;
  p99Ms?: number;
  note?: string;
}

/** A figure that is not a throughput (sizes, timings of one operation, ratios). */
export interface BenchFigure {
  group: string;
  name: string;
  value: string;
  note?: string;
}

export interface Machine {
  cpu: string;
  cores: number;
  memoryGiB: number;
  os: string;
  /** 1-minute load average when the run began: a busy shared machine shows here. */
  load: number;
  node: string;
  postgres: string;
  date: string;
}

export interface Report {
  machine: Machine;
  results: BenchResult[];
  figures: BenchFigure[];
  /** Free-form lines per group (e.g. the printed output of a benchmark that returns nothing). */
  notes: Array<{ group: string; lines: string[] }>;
  /** Benchmarks that failed, with why. */
  failures: Array<{ group: string; error: string }>;
  /** The few figures a reader should see first (listed above the tables and under the chart). */
  highlights?: string[];
  /** Wall-clock seconds the whole run took. */
  seconds?: number;
  /** The comparison with a bare handler and the peers (bench/compare), under its own heading. */
  comparison?: { group: string; data: Comparison; machine?: Machine };
  /** Groups not run this time, kept from an earlier report, with the date each was measured. */
  carried?: Array<{ group: string; date: string }>;
}
