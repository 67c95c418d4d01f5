// TypeScript rewrites `./x.ts` to `./x.js` in the JavaScript it emits (rewriteRelativeImportExtensions)
// but leaves the `.ts` specifiers in the declaration files, which consumers' compilers then refuse or
// cannot resolve. This turns every relative `.ts` specifier in dist/**/*.d.ts into `.js`, the form
// `moduleResolution: nodenext` and `bundler` both resolve to the `.d.ts` beside it.
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const RELATIVE_TS = /((?:from|import)\s*\(?\s*["'])(\.{1,2}\/[^"']+)\.ts(["'])/g;

function walk(dir) {
  let changed = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) changed += walk(path);
    else if (entry.name.endsWith(".d.ts")) {
      const before = readFileSync(path, "utf8");
      const after = before.replace(RELATIVE_TS, "$1$2.js$3");
      if (after !== before) {
        writeFileSync(path, after);
        changed++;
      }
    }
  }
  return changed;
}

const dir = process.argv[2] ?? "dist";
console.log(`rewrote .ts specifiers in ${walk(dir)} declaration files under ${dir}/`);
