// `npm pack` and `npm publish` ship package.json as it is on disk after `prepack`. In this repository
// every export has a `source` condition pointing at `src/*.ts`, which the tests, `npm start` and the
// benchmarks resolve with `--conditions=source`; the tarball holds no `src/`, so a user running with
// that condition would get ERR_MODULE_NOT_FOUND. `strip` (prepack) writes package.json without those
// conditions and keeps the original beside it; `restore` (postpack) puts the original back. Each write
// is a rename, so a process reading package.json meanwhile never sees half a file.
import { existsSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";

const FILE = "package.json";
const KEPT = ".package.json.prepack";

function replace(text) {
  writeFileSync(`${FILE}.tmp`, text);
  renameSync(`${FILE}.tmp`, FILE);
}

const command = process.argv[2];
if (command === "strip") {
  const original = readFileSync(FILE, "utf8");
  if (existsSync(KEPT)) {
    console.error(
      `${KEPT} exists: a previous pack did not finish; run node scripts/pack-manifest.mjs restore`,
    );
    process.exit(1);
  }
  writeFileSync(KEPT, original);
  const pkg = JSON.parse(original);
  for (const target of Object.values(pkg.exports)) {
    if (typeof target === "object" && target !== null) delete target.source;
  }
  replace(`${JSON.stringify(pkg, null, 2)}\n`);
} else if (command === "restore") {
  if (existsSync(KEPT)) {
    replace(readFileSync(KEPT, "utf8"));
    rmSync(KEPT);
  }
} else {
  console.error("usage: node scripts/pack-manifest.mjs strip|restore");
  process.exit(2);
}
