/**
 * `npm test` on whatever Node the machine has (scripts/test.mjs): when the development tools support
 * this Node it runs them on it; when one does not (its `engines`), it runs the whole tier under Node 24
 * from the npm registry, installed into the cache outside the tree, and says so in one line. Here in a
 * copy of the script beside stand-in tools (their `engines` chosen by the test; the lint, type, import,
 * API and docs-site steps each print their name; Vitest a script that prints the Node it runs on), with
 * the real cache that .ci/run fills (on a machine without Node 24 there, the script installs it from the
 * registry).
 */
import { execFile } from "node:child_process";
import { cpSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";

const run = promisify(execFile);
const TOOLS = [
  "vitest",
  "vite",
  "@biomejs/biome",
  "typescript",
  "dependency-cruiser",
  "@microsoft/api-extractor",
  "tsx",
];
/** The checks the fast tier runs before Vitest, in order: the docs site's build among them (CI's). */
const STEPS = ["lint", "typecheck", "check:imports", "api:check", "docs:build"];
const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** A project with scripts/test.mjs and stand-in tools; `vite` declares `viteEngines`. */
function project(viteEngines: string): string {
  const dir = mkdtempSync(join(tmpdir(), "idem-test-runner-"));
  dirs.push(dir);
  mkdirSync(join(dir, "scripts"));
  cpSync("scripts/test.mjs", join(dir, "scripts/test.mjs"));
  const step = `node -e "console.log('step ' + process.env.npm_lifecycle_event)"`;
  writeFileSync(
    join(dir, "package.json"),
    JSON.stringify({
      name: "p",
      private: true,
      type: "module",
      scripts: Object.fromEntries(STEPS.map((name) => [name, step])),
    }),
  );
  for (const tool of TOOLS) {
    mkdirSync(join(dir, "node_modules", tool), { recursive: true });
    const engines = tool === "vite" ? { node: viteEngines } : { node: ">=18" };
    writeFileSync(
      join(dir, "node_modules", tool, "package.json"),
      JSON.stringify({ name: tool, version: "1.0.0", engines }),
    );
  }
  writeFileSync(
    join(dir, "node_modules/vitest/vitest.mjs"),
    'console.log(`vitest on ${process.version}: ${process.argv.slice(2).join(" ")}`);\n',
  );
  symlinkSync(join(process.cwd(), "node_modules/semver"), join(dir, "node_modules/semver"), "dir");
  return dir;
}

const env = {
  ...process.env,
  IDEM_NODE_CACHE:
    process.env.IDEM_NODE_CACHE ??
    join(process.env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "idem-ci", "node"),
  IDEM_TOOLS_NODE: "",
  IDEM_TOOLS_NODE_SWITCHED: "",
};

describe("npm test's Node (scripts/test.mjs)", () => {
  it("runs the tools on this Node when they support it, saying nothing about Node", async () => {
    const dir = project(">=18");
    const { stdout } = await run(process.execPath, ["scripts/test.mjs", "test/x"], { cwd: dir, env });
    expect(stdout).toContain(`vitest on ${process.version}: run --project fast test/x`);
    expect(stdout).not.toContain("running under Node");
    const ran = stdout.split("\n").filter((l) => l.startsWith("step ") || l.startsWith("vitest on"));
    expect(ran.slice(0, -1)).toEqual(STEPS.map((name) => `step ${name}`));
  }, 120_000);

  it("runs the whole tier under Node 24 from the registry when a tool does not support this Node", async () => {
    const dir = project(">=99");
    const { stdout } = await run(process.execPath, ["scripts/test.mjs", "--slow"], {
      cwd: dir,
      env,
      timeout: 300_000,
    });
    const lines = stdout.trim().split("\n");
    expect(lines[0]).toMatch(
      new RegExp(
        `^npm run test:slow: vite needs Node >=99, this is ${process.version.replaceAll(".", "\\.")}: running under Node v24\\.`,
      ),
    );
    expect(stdout).toMatch(/vitest on v24\.\d+\.\d+: run --project slow/);
  }, 300_000);
});
