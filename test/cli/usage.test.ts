/** The command line's contract with scripts: exit 2 and one line for bad usage, never a Node stack. */
import { readFileSync } from "node:fs";
import { afterEach, describe, expect, it, vi } from "vitest";
import { main } from "../../src/cli/main.ts";

afterEach(() => vi.restoreAllMocks());

async function runCli(argv: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  vi.spyOn(console, "log").mockImplementation((...a) => void out.push(a.join(" ")));
  vi.spyOn(console, "error").mockImplementation((...a) => void err.push(a.join(" ")));
  const code = await main(argv);
  return { code, out: out.join("\n"), err: err.join("\n") };
}

describe("idem's exit codes", () => {
  it("prints the version", async () => {
    const pkg = JSON.parse(readFileSync("package.json", "utf8"));
    expect(await runCli(["--version"])).toMatchObject({ code: 0, out: pkg.version });
  });

  it.each([
    [["relay", "--once", "--retention-hours", "-1"], /--retention-hours=-1/],
    [["sweep", "--retention-hours=-3"], /--retention-hours takes a positive number/],
    [["provider", "--port", "70000"], /--port takes a port number/],
    [["migrate", "--bogus"], /Unknown option '--bogus' \(idem migrate --help shows every option\)/],
    [["serve"], /unknown command "serve"/],
  ])("%j is bad usage: exit 2 and one line", async (argv, message) => {
    const { code, err } = await runCli(argv);
    expect(code).toBe(2);
    expect(err.split("\n")).toHaveLength(1);
    expect(err).toMatch(message);
  });
});
