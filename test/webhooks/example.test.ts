/** examples/webhooks.ts runs and says what docs/webhooks.md says it says; the page shows it as it is. */
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";

const run = promisify(execFile);

describe("the webhooks example", () => {
  it("applies once, answers a redelivery as a duplicate, records the late event stale, refuses the tampered one", async () => {
    const { stdout } = await run("node_modules/.bin/tsx", ["--conditions=source", "examples/webhooks.ts"], {
      timeout: 120_000,
      env: { ...process.env, DATABASE_URL: "" }, // the embedded database, as the doc runs it
    });
    const printed = stdout.trim();
    expect(printed).toBe(
      [
        "succeeded: 200 applied",
        "succeeded again (a redelivery): 200 duplicate",
        "processing, late (older than the row): 200 stale",
        "tampered: 401 no v1 signature matches the body with any of the secrets",
        "payment intents: pi_1 succeeded",
      ].join("\n"),
    );
    expect(readFileSync("docs/webhooks.md", "utf8")).toContain(printed);
  }, 150_000);

  it("docs/webhooks.md shows the example's code as it is in examples/", () => {
    const source = readFileSync("examples/webhooks.ts", "utf8");
    const snippet = source.split("// #region snippet\n")[1]!.split("// #endregion snippet")[0]!.trim();
    expect(readFileSync("docs/webhooks.md", "utf8")).toContain(snippet);
  });
});
