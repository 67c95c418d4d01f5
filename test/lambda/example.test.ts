/** examples/lambda.ts runs as docs/serverless.md says, and the page shows it as it is. */
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { sayWhySkippedWithoutServer } from "../helpers/db.ts";

const run = promisify(execFile);

sayWhySkippedWithoutServer();
describe.skipIf(!process.env.DATABASE_URL)("examples/lambda.ts", () => {
  it("replays the HTTP invocation and applies the SQS record once", async () => {
    const { stdout } = await run("node_modules/.bin/tsx", ["--conditions=source", "examples/lambda.ts"], {
      timeout: 120_000,
    });
    expect(stdout).toMatch(/invocation 1: 201 replayed=false \{"id":\d+,"amount_cents":5000\}/);
    expect(stdout).toMatch(/invocation 2: 201 replayed=true \{"id":\d+,"amount_cents":5000\}/);
    expect(stdout).toContain("SQS delivery 2: batchItemFailures []");
    expect(stdout).toContain("payments for the account: 2");
  }, 150_000);
});

describe("docs/serverless.md", () => {
  it("shows the Lambda example as it is in examples/", () => {
    const example = readFileSync("examples/lambda.ts", "utf8");
    const snippet = example.slice(
      example.indexOf("// #region snippet\n") + "// #region snippet\n".length,
      example.indexOf("// #endregion snippet"),
    );
    expect(readFileSync("docs/serverless.md", "utf8")).toContain(snippet.trim());
  });
});
