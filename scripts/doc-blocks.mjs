#!/usr/bin/env node
/**
 * The code blocks of README.md and docs/*.md, checked the way a user would use them: every TypeScript
 * block (```ts) is type-checked against idem's public entry points (`idem`, `idem/postgres`, ...,
 * resolved through package.json's exports, as from an installed package), and a block marked to run is
 * run. test/docs/code-blocks.test.ts calls it; so can a docs build.
 *
 *   node scripts/doc-blocks.mjs [file.md ...]   type-check (default: README.md and docs/*.md); prints
 *                                               each error at its line in the document, exits 1 if any
 *
 * A block's mark is an HTML comment on the last non-blank line above its fence:
 *   (none)                          type-checked
 *   <!-- run -->                    type-checked, then run to its end: it must exit 0 (`runBlock`)
 *   <!-- run: until SIGTERM -->     type-checked, then run; after a few seconds it gets SIGTERM and must
 *                                   exit 0 by itself (what a service's shutdown does)
 *   <!-- from: examples/x.ts -->    a verbatim excerpt of that file, which is type-checked whole (and run
 *                                   by the tests that run the examples)
 *   <!-- not checked: <reason> -->  neither (say why: a package idem does not depend on, pseudo-code)
 * Shell blocks keep their own mark, `<!-- not run: <reason> -->` (test/docs/commands.test.ts runs them).
 *
 * A type-checked block may use names it does not define when they are the usual ones of the page
 * (`db`, `tx`, `app`, `store`...): scripts/doc-blocks-context.d.ts declares them, with their types.
 * Each block is a module of its own (top-level await allowed), written to .cache/doc-blocks/.
 */
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = fileURLToPath(new URL("..", import.meta.url));
const OUT = join(ROOT, ".cache", "doc-blocks");
const CONTEXT = join(ROOT, "scripts", "doc-blocks-context.d.ts");
const TS_LANGS = new Set(["ts", "typescript"]);
const MARK = /^<!--\s*(run|from|not checked|not run)\s*(?::\s*(.*?))?\s*-->$/;

/**
 * @typedef {{ kind: "run" | "from" | "not checked" | "not run", reason?: string }} Mark
 * @typedef {{ file: string, line: number, lang: string, code: string, mark?: Mark }} Block
 *   `file` relative to the repository, `line` the fence's line (1-based); `code` without the fence
 *   and without the fence's indentation.
 */

/** The documents checked by default: README.md and every docs/*.md. */
export function defaultDocs() {
  const docs = readdirSync(join(ROOT, "docs"))
    .filter((f) => f.endsWith(".md"))
    .sort()
    .map((f) => `docs/${f}`);
  return ["README.md", ...docs];
}

/** Every fenced block of a Markdown file, with the mark above it. */
export function codeBlocks(file) {
  const lines = readFileSync(join(ROOT, file), "utf8").split("\n");
  /** @type {Block[]} */
  const blocks = [];
  let open;
  let above = "";
  for (const [i, text] of lines.entries()) {
    const fence = /^(\s*)```\s*([\w-]*)/.exec(text);
    if (!open) {
      if (fence) open = { indent: fence[1] ?? "", lang: fence[2] ?? "", line: i + 1, above };
      else if (text.trim() !== "") above = text.trim();
      continue;
    }
    if (!fence || (fence[1] ?? "").length !== open.indent.length || fence[2]) continue;
    const code = lines
      .slice(open.line, i)
      .map((l) => (l.startsWith(open.indent) ? l.slice(open.indent.length) : l.trimStart()))
      .join("\n");
    const m = MARK.exec(open.above);
    /** @type {Block} */
    const block = { file, line: open.line, lang: open.lang, code };
    if (m) block.mark = { kind: /** @type {Mark["kind"]} */ (m[1]), ...(m[2] ? { reason: m[2] } : {}) };
    blocks.push(block);
    open = undefined;
    above = "";
  }
  return blocks;
}

/** The TypeScript blocks of `files`. */
export function typescriptBlocks(files = defaultDocs()) {
  return files.flatMap(codeBlocks).filter((b) => TS_LANGS.has(b.lang));
}

/** Marks that say nothing, or the wrong thing, for a TypeScript block: one message per mistake. */
export function markProblems(blocks) {
  const problems = [];
  for (const b of blocks) {
    const where = `${b.file}:${b.line}`;
    if (b.mark?.kind === "not run")
      problems.push(`${where}: a TypeScript block is marked "not checked: <reason>", not "not run"`);
    if (b.mark?.kind === "not checked" && !/\w{3,}.*\w{3,}/.test(b.mark.reason ?? ""))
      problems.push(`${where}: "not checked" needs a reason`);
    if (b.mark?.kind === "run" && b.mark.reason && b.mark.reason !== "until SIGTERM")
      problems.push(`${where}: "run" takes no argument but "until SIGTERM"`);
    if (b.mark?.kind === "from") {
      const path = join(ROOT, b.mark.reason ?? "");
      const source = existsSync(path) && b.mark.reason ? readFileSync(path, "utf8") : undefined;
      if (source === undefined) problems.push(`${where}: "from: ${b.mark.reason ?? ""}" names no file`);
      else if (!source.includes(b.code.trim()))
        problems.push(`${where}: the block is not a verbatim excerpt of ${b.mark.reason}`);
    }
  }
  return problems;
}

/** The file a block is written to (a module of its own). */
function blockPath(b, dir = OUT) {
  return join(dir, `${b.file.replaceAll("/", "__")}.L${b.line}.ts`);
}

/** The block as a module: `export {}` makes one of a block with no import or export. */
function moduleText(b) {
  return /^\s*(import|export)\s/m.test(b.code) ? `${b.code}\n` : `${b.code}\nexport {};\n`;
}

/** Write the blocks' modules to .cache/doc-blocks/ (emptied first). */
function writeBlocks(blocks, dir = OUT) {
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  for (const b of blocks) writeFileSync(blockPath(b, dir), moduleText(b));
}

/** Copy a repository file into `dir` at the same relative path, with the local files it imports. */
function copyWithLocalImports(file, dir, done = new Set()) {
  if (done.has(file)) return;
  done.add(file);
  const text = readFileSync(join(ROOT, file), "utf8");
  mkdirSync(dirname(join(dir, file)), { recursive: true });
  writeFileSync(join(dir, file), text);
  for (const [, spec] of text.matchAll(/from "(\.{1,2}\/[^"]+)"/g)) {
    copyWithLocalImports(relative(ROOT, join(ROOT, dirname(file), spec ?? "")), dir, done);
  }
}

/**
 * Type-check the blocks not marked "not checked" (and the whole files that "from" blocks are excerpts
 * of). Resolves with one message per error, `README.md:123: TS2345 ...` at the document's line.
 *
 * By default in the repository, with its compiler options (strict, noUncheckedIndexedAccess) and idem
 * resolved by its own package name (to src/ through the `source` condition). With `dir` (a project
 * where a packed idem is installed) the blocks, the context and the example files are written there
 * and checked with `compilerOptions` (tsconfig.json's `compilerOptions` form) against what that
 * project resolves: the tarball's declarations.
 */
export async function typecheckBlocks(blocks, options = {}) {
  const { default: ts } = await import("typescript");
  const dir = options.dir ?? OUT;
  const checked = blocks.filter((b) => b.mark?.kind !== "not checked" && b.mark?.kind !== "from");
  const fromFiles = [
    ...new Set(blocks.filter((b) => b.mark?.kind === "from").map((b) => b.mark?.reason)),
  ].filter((f) => f && existsSync(join(ROOT, f)));
  writeBlocks(checked, options.dir ? join(dir, ".doc-blocks") : dir);
  const pathOf = (b) => blockPath(b, options.dir ? join(dir, ".doc-blocks") : dir);
  let context = CONTEXT;
  let sources = fromFiles.map((f) => join(ROOT, f));
  if (options.dir) {
    context = join(dir, ".doc-blocks", "context.d.ts");
    writeFileSync(context, readFileSync(CONTEXT, "utf8"));
    for (const f of fromFiles) copyWithLocalImports(f, dir);
    sources = fromFiles.map((f) => join(dir, f));
    const { options: compilerOptions, errors } = ts.convertCompilerOptionsFromJson(
      options.compilerOptions ?? {},
      dir,
    );
    if (errors.length) throw new Error(ts.flattenDiagnosticMessageText(errors[0].messageText, "\n"));
    return diagnose(ts, [context, ...sources, ...checked.map(pathOf)], compilerOptions, checked, pathOf, dir);
  }
  const config = ts.getParsedCommandLineOfConfigFile(
    join(ROOT, "tsconfig.json"),
    {},
    {
      ...ts.sys,
      onUnRecoverableConfigFileDiagnostic: (d) => {
        throw new Error(ts.flattenDiagnosticMessageText(d.messageText, "\n"));
      },
    },
  );
  if (!config) throw new Error("tsconfig.json could not be read");
  return diagnose(
    ts,
    [context, ...sources, ...checked.map(pathOf)],
    { ...config.options, noEmit: true, incremental: false },
    checked,
    pathOf,
    ROOT,
  );
}

/** Compile `rootNames` and say each error at its document's line (or its file's, relative to `base`). */
function diagnose(ts, rootNames, options, checked, pathOf, base) {
  const program = ts.createProgram({ rootNames, options });
  const byPath = new Map(checked.map((b) => [pathOf(b), b]));
  const messages = [];
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const text = ts.flattenDiagnosticMessageText(d.messageText, "\n");
    if (!d.file) {
      messages.push(`TS${d.code}: ${text}`);
      continue;
    }
    const { line } = d.file.getLineAndCharacterOfPosition(d.start ?? 0);
    const b = byPath.get(d.file.fileName);
    messages.push(
      b
        ? `${b.file}:${b.line + 1 + line}: TS${d.code} ${text}`
        : `${relative(base, d.file.fileName)}:${line + 1}: TS${d.code} ${text}`,
    );
  }
  return messages;
}

/**
 * Run one block as a user runs a copied file (`node --import tsx`, idem resolved by its package name,
 * cwd the repository), with `env`, its code first passed through `rewrite` (a test gives the block's
 * queue or stream a name of its own). A `run` block must exit 0 within `timeoutMs`. A `run: until
 * SIGTERM` block gets SIGTERM once `ready(output)` resolves true (polled; default: after 3 s) and must
 * then exit 0 within `timeoutMs`. Resolves with its exit code (null: killed, or it never got ready),
 * its output, and whether it had to be killed.
 */
export async function runBlock(b, options = {}) {
  const { env = process.env, timeoutMs = 60_000, rewrite = (code) => code } = options;
  const started = Date.now();
  const ready = options.ready ?? (() => Date.now() - started > 3_000);
  const path = blockPath(b).replace(/\.ts$/, ".run.ts");
  mkdirSync(OUT, { recursive: true });
  writeFileSync(path, moduleText({ ...b, code: rewrite(b.code) }));
  const untilSignal = b.mark?.reason === "until SIGTERM";
  const child = spawn(process.execPath, ["--conditions=source", "--import", "tsx", path], {
    cwd: ROOT,
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout.on("data", (d) => (output += d));
  child.stderr.on("data", (d) => (output += d));
  const exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
  let killed = false;
  let gone = false;
  exited.then(() => (gone = true));
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  if (untilSignal) {
    const deadline = Date.now() + timeoutMs;
    let isReady = false;
    while (!gone && Date.now() < deadline) {
      isReady = await ready(output);
      if (isReady) break;
      await sleep(100);
    }
    if (!gone && !isReady) {
      killed = true;
      child.kill("SIGKILL");
      output += `\n[doc-blocks: not ready within ${timeoutMs} ms: killed]`;
    } else if (!gone) child.kill("SIGTERM");
  }
  const timer = setTimeout(() => {
    killed = true;
    child.kill("SIGKILL");
    output += `\n[doc-blocks: still running ${timeoutMs} ms after ${untilSignal ? "SIGTERM" : "its start"}: killed]`;
  }, timeoutMs);
  const { code } = await exited;
  clearTimeout(timer);
  return { code: killed ? null : code, output, killed };
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const files = process.argv.slice(2);
  const blocks = typescriptBlocks(files.length ? files : defaultDocs());
  const problems = [...markProblems(blocks), ...(await typecheckBlocks(blocks))];
  for (const p of problems) console.error(p);
  const count = (kind) => blocks.filter((b) => b.mark?.kind === kind).length;
  console.log(
    `doc blocks: ${blocks.length} TypeScript blocks: ${blocks.length - count("not checked") - count("from")} ` +
      `type-checked as written (${count("run")} of them also run by test/docs/code-blocks.test.ts), ` +
      `${count("from")} excerpts of examples/ checked whole, ${count("not checked")} marked not checked; ` +
      `${problems.length} problem(s)`,
  );
  process.exitCode = problems.length ? 1 : 0;
}
