/**
 * The README's figures are generated, never typed: its one table of benchmark figures is
 * bench/results/latest.json as bench/readme.ts renders it (`npm run bench` writes both; after editing
 * the renderer, `npx tsx bench/readme.ts` writes it again without measuring).
 */
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { readmeFigures } from "../../bench/readme.ts";
import type { Report } from "../../bench/report-types.ts";

describe("the README's benchmark figures", () => {
  it("are bench/results/latest.json rendered by bench/readme.ts, in one table", () => {
    const report = JSON.parse(readFileSync("bench/results/latest.json", "utf8")) as Report;
    const readme = readFileSync("README.md", "utf8");
    const block = readmeFigures(report);
    expect(readme, "run npx tsx bench/readme.ts").toContain(block);
    expect(readme.match(/<!-- bench-figures -->/g)).toHaveLength(1);
    // Its header names the run: date, machine, load.
    expect(block).toContain(
      `on ${report.machine.date.slice(0, 10)} (${report.machine.cpu} × ${report.machine.cores}`,
    );
    expect(block).toContain(`load ${report.machine.load} at the start`);
    expect(block.split("\n").filter((l) => l.startsWith("| ")).length).toBeGreaterThan(8);
  });
});
