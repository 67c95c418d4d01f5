#!/usr/bin/env node
// Runs the built CLI (dist/) when present; in a checkout without a build, runs the TypeScript sources
// through tsx with the "source" export condition, so `npm run idem -- <command>` works from a clone.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

const dist = new URL("../dist/cli/main.js", import.meta.url);
if (existsSync(dist)) {
  const { main } = await import(dist.href);
  process.exitCode = await main(process.argv.slice(2));
} else {
  const src = fileURLToPath(new URL("../src/cli/main.ts", import.meta.url));
  const r = spawnSync(
    process.execPath,
    ["--conditions=source", "--import", "tsx", src, ...process.argv.slice(2)],
    {
      stdio: "inherit",
    },
  );
  process.exitCode = r.status ?? 1;
}
