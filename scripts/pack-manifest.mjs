// `npm pack` and `npm publish` ship package.json as it is on disk after `prepack`. `strip` (prepack)
// writes the manifest a user installs and keeps the repository's beside it; `restore` (postpack) puts the
// original back. Each write is a rename, so a process reading package.json meanwhile never sees half a
// file. What changes for the tarball:
// - every export's `source` condition goes (it points at src/*.ts, which the tarball does not hold: a
//   user running with that condition would get ERR_MODULE_NOT_FOUND); the tests, `npm start` and the
//   benchmarks resolve it here with `--conditions=source`;
// - `scripts`, `devDependencies`, `workspaces` and `overrides` go: they are the repository's (a
//   `prepare` script would make npm run, or flag, an install script at every user's install);
// - `main`, `types` and `typesVersions` are derived from `exports`, for resolvers that predate it
//   (TypeScript's `moduleResolution: node10`, old bundlers): `idem` and every `idem/<subpath>` resolve
//   to the same files as through `exports`. The package is ES modules; CommonJS callers require() it
//   on Node 20.19+ (require of ES modules), which the consumer test checks for every subpath.
import { existsSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const FILE = "package.json";
const KEPT = ".package.json.prepack";

function replace(text) {
  writeFileSync(`${FILE}.tmp`, text);
  renameSync(`${FILE}.tmp`, FILE);
}

/** The manifest users install, made from the repository's. */
export function packed(pkg) {
  const exports = {};
  for (const [subpath, target] of Object.entries(pkg.exports)) {
    if (typeof target !== "object" || target === null) exports[subpath] = target;
    else exports[subpath] = Object.fromEntries(Object.entries(target).filter(([k]) => k !== "source"));
  }
  const root = exports["."];
  const subpaths = Object.entries(exports).filter(([k, v]) => k !== "." && typeof v === "object" && v.types);
  const out = {};
  for (const [field, value] of Object.entries(pkg)) {
    if (["scripts", "devDependencies", "workspaces", "overrides"].includes(field)) continue;
    if (field === "exports") {
      out.main = root.default;
      out.types = root.types;
      out.typesVersions = { "*": Object.fromEntries(subpaths.map(([k, v]) => [k.slice(2), [v.types]])) };
      out.exports = exports;
      continue;
    }
    out[field] = value;
  }
  return out;
}

const command = process.argv[2];
if (process.argv[1] === fileURLToPath(import.meta.url)) {
  if (command === "strip") {
    const original = readFileSync(FILE, "utf8");
    if (existsSync(KEPT)) {
      console.error(
        `${KEPT} exists: a previous pack did not finish; run node scripts/pack-manifest.mjs restore`,
      );
      process.exit(1);
    }
    writeFileSync(KEPT, original);
    replace(`${JSON.stringify(packed(JSON.parse(original)), null, 2)}\n`);
  } else if (command === "restore") {
    if (existsSync(KEPT)) {
      replace(readFileSync(KEPT, "utf8"));
      rmSync(KEPT);
    }
  } else {
    console.error("usage: node scripts/pack-manifest.mjs strip|restore");
    process.exit(2);
  }
}
