#!/usr/bin/env node
// The `idem` command. Installed from the package, it runs the built CLI (dist/) with plain node. In a
// clone of the repository (where src/ exists), it runs the TypeScript sources through tsx with the
// "source" export condition instead, so `npx idem` / `npm run idem -- <command>` work without a build
// and `idem complete --module runners.ts` can load a TypeScript module.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

const src = fileURLToPath(new URL("../src/cli/main.ts", import.meta.url));
if (existsSync(src)) {
  const r = spawnSync(
    process.execPath,
    ["--conditions=source", "--import", "tsx", src, ...process.argv.slice(2)],
    { stdio: "inherit" },
  );
  process.exitCode = r.status ?? 1;
} else {
  const { main } = await import(new URL("../dist/cli/main.js", import.meta.url).href);
  process.exitCode = await main(process.argv.slice(2));
}
