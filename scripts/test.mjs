#!/usr/bin/env node
/**
 * `npm test` and `npm run test:slow`, on whatever Node.js the machine has.
 *
 *   npm test             lint, types, import rules, the API report, the docs site's build (VitePress:
 *                        fails on a dead link), then Vitest's fast tier (every
 *                        test/**\/*.test.ts but *.slow.test.ts); `npm test -- test/core` passes the
 *                        arguments after `--` to Vitest
 *   npm run test:slow    Vitest's slow tier (test/**\/*.slow.test.ts): chaos, the packed tarball installed
 *                        in fresh projects, soaks, private clusters
 *
 * The library runs on Node 20.19+, and so do the development tools today; but each tool says which Node
 * it runs on (its package's `engines`). When this Node is not one of them, the tier runs under Node 24
 * instead: the official binary from the npm registry (node-<os>-<arch>@24), installed once into
 * ~/.cache/idem-ci/node/24 (IDEM_NODE_CACHE, outside the tree; .ci/run uses the same cache), and it says
 * so in one line. IDEM_TOOLS_NODE=24 asks for that Node whatever this one is.
 */
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { homedir } from "node:os";
import { delimiter, join } from "node:path";
import { fileURLToPath } from "node:url";
import semver from "semver";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const SELF = fileURLToPath(import.meta.url);
/** The tools `npm test` runs, with the packages they load that declare a Node range of their own. */
const TOOLS = [
  "vitest",
  "vite",
  "@biomejs/biome",
  "typescript",
  "dependency-cruiser",
  "@microsoft/api-extractor",
  "tsx",
];
const NEWER = "24";

const args = process.argv.slice(2);
const slow = args[0] === "--slow";
const vitestArgs = slow ? args.slice(1) : args;

/** The first tool whose `engines.node` this Node does not satisfy, or undefined. */
function toolNotRunningHere() {
  for (const name of TOOLS) {
    const manifest = join(ROOT, "node_modules", name, "package.json");
    if (!existsSync(manifest)) {
      console.error(`npm test: ${name} is not installed: run npm ci first`);
      process.exit(1);
    }
    const range = JSON.parse(readFileSync(manifest, "utf8")).engines?.node;
    if (range && !semver.satisfies(process.version, range)) return { name, range };
  }
  return undefined;
}

/** The bin folder of Node `major` in the cache, installed from the npm registry if it is not there. */
function nodeFromRegistry(major) {
  const cache =
    process.env.IDEM_NODE_CACHE ??
    join(process.env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "idem-ci", "node");
  const os = process.platform === "win32" ? "win" : process.platform;
  const pkg = `node-${os}-${process.arch}`;
  const prefix = join(cache, major);
  const bin = join(prefix, "node_modules", pkg, "bin");
  const node = join(bin, process.platform === "win32" ? "node.exe" : "node");
  const installed = () =>
    existsSync(node) && spawnSync(node, ["--version"], { encoding: "utf8" }).stdout?.startsWith(`v${major}.`);
  if (!installed()) {
    const npm = spawnSync(
      "npm",
      ["install", "--prefix", prefix, "--no-audit", "--no-fund", "--loglevel=error", `${pkg}@${major}`],
      { stdio: ["ignore", "ignore", "inherit"], shell: process.platform === "win32" },
    );
    if (npm.status !== 0 || !installed()) {
      console.error(`npm test: could not install Node ${major} (${pkg}@${major}) into ${prefix}`);
      process.exit(1);
    }
  }
  return { bin, node };
}

const wanted = process.env.IDEM_TOOLS_NODE || undefined;
const misfit = toolNotRunningHere();
if (
  !process.env.IDEM_TOOLS_NODE_SWITCHED &&
  (misfit || (wanted && !process.version.startsWith(`v${wanted}.`)))
) {
  const major = wanted ?? NEWER;
  const { bin, node } = nodeFromRegistry(major);
  const version = spawnSync(node, ["--version"], { encoding: "utf8" }).stdout.trim();
  const why = misfit ? `${misfit.name} needs Node ${misfit.range}` : `IDEM_TOOLS_NODE=${wanted}`;
  console.log(
    `${slow ? "npm run test:slow" : "npm test"}: ${why}, this is ${process.version}: running under Node ${version} from ${bin}`,
  );
  const child = spawnSync(node, [SELF, ...args], {
    stdio: "inherit",
    env: {
      ...process.env,
      PATH: `${bin}${delimiter}${process.env.PATH ?? ""}`,
      IDEM_TOOLS_NODE_SWITCHED: "1",
    },
  });
  process.exit(child.status ?? 1);
}

/** Run one step with this Node; stop the whole run at its first failure. */
function step(command, argv) {
  const result = spawnSync(command, argv, { stdio: "inherit", cwd: ROOT });
  if (result.status !== 0) process.exit(result.status ?? 1);
}

const npmCli = process.env.npm_execpath;
const npmRun = (script) =>
  npmCli && existsSync(npmCli)
    ? step(process.execPath, [npmCli, "run", "--silent", script])
    : step("npm", ["run", script]);

if (!slow)
  for (const script of ["lint", "typecheck", "check:imports", "api:check", "docs:build"]) npmRun(script);
step(process.execPath, [
  join(ROOT, "node_modules", "vitest", "vitest.mjs"),
  "run",
  "--project",
  slow ? "slow" : "fast",
  ...vitestArgs,
]);
