/** The examples of the README and the docs run, and say what their pages say they say. */
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";

const run = promisify(execFile);

describe("examples", () => {
  it("quickstart: the retry replays and one charge exists", async () => {
    const { stdout } = await run("node_modules/.bin/tsx", ["--conditions=source", "examples/quickstart.ts"], {
      timeout: 120_000,
    });
    expect(stdout).toContain('attempt 1: 201 replayed=false {"id":1,"amount_cents":5000}');
    expect(stdout).toContain('attempt 2: 201 replayed=true {"id":1,"amount_cents":5000}');
    expect(stdout).toContain("charges in the table: 1");
  }, 150_000);

  it("phases: the retry replays, the provider charged once, one payment row, twice", async () => {
    // Twice, as a user would run it: each run makes a key of its own (it exits 1 if its check fails).
    const ids: string[] = [];
    for (const _round of [1, 2]) {
      const { stdout } = await run("node_modules/.bin/tsx", ["--conditions=source", "examples/phases.ts"], {
        timeout: 120_000,
      });
      const first = stdout.match(/attempt 1: 201 replayed=false (pay_ch_\w+)/);
      expect(first).not.toBeNull();
      expect(stdout).toContain(`attempt 2: 201 replayed=true ${first?.[1]}`);
      expect(stdout).toContain("provider charges: 1, payments: 1");
      ids.push(first?.[1] ?? "");
    }
    expect(new Set(ids).size).toBe(2);
  }, 300_000);

  it("docs/phases.md shows the phases example as it is in examples/", () => {
    const doc = readFileSync("docs/phases.md", "utf8");
    expect(doc).toContain(readFileSync("examples/phases.ts", "utf8").trim());
  });

  it("effects in the transaction only: the retry on another instance replays, one charge, twice", async () => {
    // Twice: each run makes a key of its own, so a second run on the same database checks again.
    for (const _round of [1, 2]) {
      const { stdout, stderr } = await run(
        "node_modules/.bin/tsx",
        ["--conditions=source", "examples/effects-in-tx.ts"],
        { timeout: 120_000 },
      );
      expect(stdout).toContain("attempt 1 on instance a: 201 replayed=false");
      expect(stdout).toContain("attempt 2 on instance b: 201 replayed=true");
      expect(stdout).toContain("charges for the key: 1");
      expect(stderr).not.toContain("AbandonedWorkError");
    }
    expect(readFileSync("docs/atomic.md", "utf8")).toContain(
      readFileSync("examples/effects-in-tx.ts", "utf8").trim(),
    );
  }, 300_000);

  it("the README shows the quickstart as it is in examples/", () => {
    const readme = readFileSync("README.md", "utf8");
    const example = readFileSync("examples/quickstart.ts", "utf8").trim();
    expect(readme).toContain(example);
  });
});
