/** The README's examples run, and say what the README says they say. */
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

  it("the README shows the quickstart as it is in examples/", () => {
    const readme = readFileSync("README.md", "utf8");
    const example = readFileSync("examples/quickstart.ts", "utf8").trim();
    expect(readme).toContain(example);
  });
});
