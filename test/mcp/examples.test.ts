/** The MCP examples run and say what docs/mcp.md says they say; the doc shows them as they are. */
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type RunningService, startService } from "../app/service.ts";
import { backends } from "../helpers/db.ts";

const run = promisify(execFile);
const tsx = (file: string, env: Record<string, string> = {}) =>
  run("node_modules/.bin/tsx", ["--conditions=source", file], {
    timeout: 120_000,
    env: { ...process.env, ...env },
  });

describe("the MCP examples", () => {
  it("examples/mcp.ts: the reply is lost, the retry is replayed, one charge", async () => {
    const { stdout } = await tsx("examples/mcp.ts");
    expect(stdout).toContain('lost replies: 1, result: {"id":1} replayed=true');
    expect(stdout).toContain("charges in the table: 1");
  }, 150_000);

  it("docs/mcp.md shows examples/mcp.ts as it is", () => {
    const doc = readFileSync("docs/mcp.md", "utf8");
    expect(doc).toContain(readFileSync("examples/mcp.ts", "utf8").trim());
  });

  describe("examples/mcp-agent.ts against the reference service", () => {
    let svc: RunningService;
    let dir: string;
    beforeAll(async () => {
      svc = await startService(backends[0]!, { paymentsMode: "phases" });
      dir = mkdtempSync(join(tmpdir(), "idem-agent-"));
    });
    afterAll(async () => {
      await svc?.stop();
      if (dir) rmSync(dir, { recursive: true, force: true });
    });

    it("pays once for the order, also when the agent runs the same order again", async () => {
      const env = { MCP_URL: `${svc.url}/mcp`, INTENTS_DIR: dir, ORDER: "order-1042" };
      const first = await tsx("examples/mcp-agent.ts", env);
      expect(first.stdout).toMatch(/create_payment: ok key=\S+ replayed=false/);
      expect(first.stdout).toContain("list_payments: ok");
      expect(first.stdout).toMatch(/Paid pay_\w+; your account shows 1 payment\(s\)\./);
      // Run again (a restarted agent retrying its task): the same intent, the same key, a replay.
      const again = await tsx("examples/mcp-agent.ts", env);
      const key = /create_payment: ok key=(\S+)/.exec(first.stdout)![1];
      expect(again.stdout).toContain(`create_payment: ok key=${key} replayed=true`);
      expect(svc.provider!.charges().filter((c) => c.amount === 4200)).toHaveLength(1);
    }, 240_000);
  });
});
