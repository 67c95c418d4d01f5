// The public surface, one API report per entry point of package.json "exports" (etc/api/*.api.md), made
// by API Extractor from the declaration files. `npm run api:check` (part of npm test) fails when the
// surface differs from the reports checked in; `npm run api:update` rewrites them, for review.
//
//   node scripts/api-report.mjs check | update
//
// The declarations are emitted once (tsc, incremental, under .cache/api/) and every
// entry point is analysed in one compiler program.
import { execFileSync } from "node:child_process";
import { mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { CompilerState, Extractor, ExtractorConfig, ExtractorLogLevel } from "@microsoft/api-extractor";

const mode = process.argv[2];
if (mode !== "check" && mode !== "update") {
  console.error("usage: node scripts/api-report.mjs check | update");
  process.exit(2);
}
const started = performance.now();
const root = resolve(import.meta.dirname, "..");
// In the worktree (paths in the reports stay relative) but not under node_modules: API Extractor takes
// any file there for another package's.
const cache = join(root, ".cache", "api");
const dts = join(cache, "dts");
const reports = join(root, "etc", "api");
const pkgPath = join(root, "package.json");
const pkg = JSON.parse(readFileSync(pkgPath, "utf8"));

// 1. The declarations, as `npm run build` makes them (same tsconfig, same .ts -> .js rewrite).
const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
const tscArgs = ["-p", "tsconfig.build.json", "--emitDeclarationOnly", "--declarationMap", "false"];
const outArgs = ["--sourceMap", "false", "--inlineSources", "false", "--outDir", dts];
const incremental = ["--incremental", "--tsBuildInfoFile", join(cache, "tsbuildinfo")];
execFileSync(process.execPath, [tsc, ...tscArgs, ...outArgs, ...incremental], {
  cwd: root,
  stdio: "inherit",
});
execFileSync(process.execPath, [join(root, "scripts", "rewrite-dts.mjs"), dts], {
  cwd: root,
  stdio: "ignore",
});
const emitted = performance.now();

// 2. One report per entry point: `.` is idem.api.md, `./client/file` is idem-client-file.api.md.
const entries = Object.entries(pkg.exports)
  .filter(([, target]) => typeof target === "object" && target.types)
  .map(([subpath, target]) => ({
    name: subpath === "." ? "idem" : `idem-${subpath.slice(2).replaceAll("/", "-")}`,
    dts: join(dts, target.types.replace(/^\.\/dist\//, "")),
  }));

const silent = { logLevel: ExtractorLogLevel.None };
const collected = { logLevel: ExtractorLogLevel.Warning, addToApiReportFile: false };
function configOf(entry) {
  return ExtractorConfig.prepare({
    configObject: {
      projectFolder: root,
      mainEntryPointFilePath: entry.dts,
      compiler: { tsconfigFilePath: join(root, "tsconfig.build.json") },
      apiReport: {
        enabled: true,
        reportFileName: `${entry.name}.api.md`,
        reportFolder: reports,
        reportTempFolder: join(cache, "temp"),
      },
      docModel: { enabled: false },
      dtsRollup: { enabled: false },
      tsdocMetadata: { enabled: false },
      newlineKind: "lf",
      messages: {
        compilerMessageReporting: { default: silent },
        // A name a public type uses but the entry point does not export is collected (`forgotten`)
        // and must be exported by some entry point (step 3). (A name without a doc comment is marked
        // `// (undocumented)` in the report.)
        extractorMessageReporting: { default: silent, "ae-forgotten-export": collected },
        tsdocMessageReporting: { default: silent },
      },
    },
    configObjectFullPath: join(root, "api-extractor.json"),
    packageJsonFullPath: pkgPath,
  });
}

mkdirSync(reports, { recursive: true });
// A report whose entry point is gone is stale: removed by update, named by check.
const stale = readdirSync(reports).filter((f) => !entries.some((e) => `${e.name}.api.md` === f));
const configs = entries.map(configOf);
const compilerState = CompilerState.create(configs[0], {
  additionalEntryPoints: entries.map((e) => e.dts),
});
const changed = stale.map((f) => `etc/api/${f}`);
if (mode === "update") for (const f of stale) rmSync(join(reports, f));
/** Names a public signature of an entry point uses that the entry point does not export. */
const forgotten = [];
for (const [i, config] of configs.entries()) {
  const messageCallback = (message) => {
    if (message.messageId === "ae-forgotten-export") {
      const name = /The symbol "([^"]+)"/.exec(message.text)?.[1];
      forgotten.push({ entry: entries[i], name, at: message.formatMessageWithLocation(root) });
    } else if (message.logLevel === ExtractorLogLevel.Error) {
      console.error(message.formatMessageWithLocation(root));
    }
    message.handled = true; // API Extractor's own progress lines are dropped
  };
  const result = Extractor.invoke(config, { localBuild: mode === "update", compilerState, messageCallback });
  if (result.apiReportChanged) changed.push(`etc/api/${entries[i].name}.api.md`);
  if (result.errorCount > 0) process.exitCode = 1;
}
// The root stays small: the protocol's names only (issue 31). More belongs in a subpath.
const ROOT_LIMIT = 40;
const program = compilerState.program;
const rootFile = program.getSourceFile(entries.find((e) => e.name === "idem").dts);
const rootNames = program
  .getTypeChecker()
  .getExportsOfModule(program.getTypeChecker().getSymbolAtLocation(rootFile));
if (rootNames.length > ROOT_LIMIT) {
  console.error(`api:check: the root \`idem\` exports ${rootNames.length} names, more than ${ROOT_LIMIT}`);
  process.exitCode = 1;
}
// 3. A closed edge: every name a public signature uses can be imported from some entry point (not
// necessarily the one whose signature uses it: `Tx` from `idem/store` serves `idem/hono` too). The
// name API Extractor gives (`Headers_2` when it clashes in that entry) is looked up among idem's own
// declarations; the one declared under that name must be exported by an entry point, and a name
// declared twice must be exported by the entry using it (which one is meant cannot be told apart).
const checker = program.getTypeChecker();
const ALIAS = 2097152; // ts.SymbolFlags.Alias
const exported = new Set();
for (const e of entries) {
  const file = program.getSourceFile(e.dts);
  const mod = file && checker.getSymbolAtLocation(file);
  for (const sym of mod ? checker.getExportsOfModule(mod) : []) {
    const target = sym.flags & ALIAS ? checker.getAliasedSymbol(sym) : sym;
    for (const d of target.declarations ?? []) exported.add(d);
  }
}
const ownFiles = program.getSourceFiles().filter((f) => f.fileName.startsWith(dts));
function declarationsNamed(name) {
  const found = new Set();
  for (const f of ownFiles) {
    const mod = checker.getSymbolAtLocation(f);
    for (const sym of [mod?.exports?.get(name), f.locals?.get(name)]) {
      if (!sym || sym.flags & ALIAS) continue;
      for (const d of (sym.exportSymbol ?? sym).declarations ?? []) found.add(d);
    }
  }
  return [...found];
}
const unexported = forgotten.filter(({ name }) => {
  const declarations = declarationsNamed(name.replace(/_\d+$/, ""));
  const files = new Set(declarations.map((d) => d.getSourceFile()));
  return files.size !== 1 || !declarations.some((d) => exported.has(d));
});
if (unexported.length) {
  console.error(
    `api:check: ${unexported.length} names used in public signatures cannot be imported from any entry point:`,
  );
  for (const u of unexported) console.error(`  ${u.name} (used by ${u.entry.name}: ${u.at})`);
  console.error(
    "Export each from an entry point (idem/store for the shared types), or keep it out of the signature.",
  );
  process.exitCode = 1;
}
const now = performance.now();
const seconds = `${((now - started) / 1000).toFixed(1)} s: declarations ${((emitted - started) / 1000).toFixed(1)} s`;
if (mode === "update") {
  console.log(`api:update: ${entries.length} reports in etc/api/, ${changed.length} changed (${seconds})`);
} else if (changed.length) {
  console.error(`api:check: the public API differs from etc/api/ in:\n  ${changed.join("\n  ")}`);
  console.error(`The new reports are in ${join(cache, "temp")}/ (diff them against etc/api/).`);
  console.error("Review the change; if it is meant, run `npm run api:update` and commit etc/api/.");
  process.exitCode = 1;
} else {
  console.log(`api:check: ${entries.length} entry points match etc/api/ (${seconds})`);
}
