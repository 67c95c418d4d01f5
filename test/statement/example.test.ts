/** examples/single-statement.ts runs and says what docs/single-statement.md says it says. */
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { promisify } from "node:util";
import { expect, it } from "vitest";

const run = promisify(execFile);

it("single statement: the retry replays, another body is 422, one charge", async () => {
  const { stdout } = await run(
    "node_modules/.bin/tsx",
    ["--conditions=source", "examples/single-statement.ts"],
    { timeout: 120_000 },
  );
  expect(stdout).toContain('attempt 1: 201 replayed=false {"id": 1, "amount_cents": 5000}');
  expect(stdout).toContain('attempt 2: 201 replayed=true {"id": 1, "amount_cents": 5000}');
  expect(stdout).toContain("another body, same key: 422");
  expect(stdout).toContain("charges in the table: 1");
  expect(readFileSync("docs/single-statement.md", "utf8")).toContain(
    readFileSync("examples/single-statement.ts", "utf8").trim(),
  );
}, 150_000);
