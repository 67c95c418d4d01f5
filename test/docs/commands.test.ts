/**
 * Every shell block (```sh / ```bash) of docs/*.md runs as written, as the README's examples do
 * (test/examples.test.ts). Each document runs against fresh databases of its own: DATABASE_URL points
 * at one, a database the block names (createdb ... idem, .../idem) becomes a fresh one too, and the
 * service's port 3000 becomes a port of the test's own. A block whose last command starts the service
 * (`npm start`) keeps it running for the blocks after it, as a second terminal would; a block that
 * calls the service when none runs gets the reference service (IDEM_DEMO=1 npm start). A block that
 * cannot run here (a Patroni cluster, another host, a key of the reader's) is marked directly above
 * with `<!-- not run: <reason> -->`, and the reason is required.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { codeBlocks } from "../../scripts/doc-blocks.mjs";
import { DATABASE_URL, freshDatabase, sayWhySkippedWithoutServer } from "../helpers/db.ts";

interface Block {
  doc: string;
  line: number;
  code: string;
  notRun?: string;
}

/** The document's shell blocks, read by the harness that reads its TypeScript blocks too. */
function blocksOf(doc: string): Block[] {
  return codeBlocks(`docs/${doc}`)
    .filter((b) => ["sh", "bash", "shell"].includes(b.lang))
    .map((b) => ({
      doc,
      line: b.line,
      code: b.code,
      ...(b.mark?.kind === "not run" ? { notRun: b.mark.reason ?? "" } : {}),
    }));
}

const docs = readdirSync("docs")
  .filter((f) => f.endsWith(".md"))
  .sort();
const blocks = docs.flatMap(blocksOf);

describe("docs/*.md shell blocks are marked honestly", () => {
  it("finds the blocks, and every block marked not run says why", () => {
    expect(blocks.length).toBeGreaterThan(5);
    expect(blocks.filter((b) => b.notRun === undefined).length).toBeGreaterThan(3);
    for (const b of blocks.filter((x) => x.notRun !== undefined)) {
      expect(b.notRun, `${b.doc}:${b.line}: a not-run mark needs a reason`).toMatch(/\w{3,}.*\w{3,}/);
    }
    // A mark anywhere else (not directly above a shell block) would silently mark nothing.
    for (const doc of docs) {
      const marks = readFileSync(join("docs", doc), "utf8").match(/<!--\s*not run:/g) ?? [];
      expect(marks.length, doc).toBe(blocks.filter((b) => b.doc === doc && b.notRun !== undefined).length);
    }
  });
});

sayWhySkippedWithoutServer();

/** A port of the test's range (25000-25499), picked at random to stay clear of a run beside it. */
function ports(): { port: number; provider: number } {
  const base = 25_000 + 2 * Math.floor(Math.random() * 240);
  return { port: base, provider: base + 1 };
}

/** Run a bash script in a process group of its own, so that whatever it leaves behind can be stopped. */
function bash(code: string, env: NodeJS.ProcessEnv): { child: ChildProcess; output: () => string } {
  const child = spawn("bash", ["-c", code], { env, detached: true, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout?.on("data", (d) => (out += d));
  child.stderr?.on("data", (d) => (out += d));
  return { child, output: () => out };
}

/** Stop a block and whatever it started (SIGTERM, then SIGKILL after 10 s), and wait until it is gone. */
async function stopGroup(child: ChildProcess): Promise<void> {
  const signal = (sig: NodeJS.Signals | 0) => {
    try {
      process.kill(-(child.pid as number), sig);
      return true;
    } catch {
      return false; // the group is gone
    }
  };
  signal("SIGTERM");
  for (let i = 0; signal(0); i++) {
    if (i === 100) signal("SIGKILL");
    if (i > 300) throw new Error(`process group ${child.pid} outlived SIGKILL`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function finished(child: ChildProcess, timeoutMs: number): Promise<number | null> {
  if (child.exitCode !== null) return child.exitCode;
  return await new Promise((resolve) => {
    const timer = setTimeout(() => resolve(null), timeoutMs);
    child.once("exit", (code) => {
      clearTimeout(timer);
      resolve(code);
    });
  });
}

/** Wait until the service answers /health (60 s at most), failing at once if it exited. */
async function healthy(child: ChildProcess, port: number, output: () => string): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`the service exited (${child.exitCode}):\n${output()}`);
    const ok = await fetch(`http://127.0.0.1:${port}/health`).then(
      (r) => r.ok,
      () => false,
    );
    if (ok) return;
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`the service did not answer /health on port ${port} within 60 s:\n${output()}`);
}

const startsService = (code: string) => /npm start\s*$/.test(code.trim());

describe.skipIf(!DATABASE_URL).each(docs.filter((d) => blocks.some((b) => b.doc === d && !b.notRun)))(
  "docs/%s",
  (doc) => {
    it("every unmarked shell block runs as written", async () => {
      const own = blocks.filter((b) => b.doc === doc && !b.notRun);
      const main = await freshDatabase("docs");
      const named = new Map<string, Awaited<ReturnType<typeof freshDatabase>>>();
      const { port, provider } = ports();
      const env: NodeJS.ProcessEnv = {
        ...process.env,
        DATABASE_URL: main.url,
        PORT: String(port),
        PROVIDER_PORT: String(provider),
        LOG_LEVEL: "warn",
      };
      const hadReport = existsSync("verify-report.json");
      let service: ReturnType<typeof bash> | undefined;
      try {
        for (const b of own) {
          // The block's own database names become fresh databases; its port 3000 becomes ours.
          let code = b.code.replaceAll(":3000", `:${port}`);
          for (const [, name = ""] of code.matchAll(/(?:-U postgres |127\.0\.0\.1:5432\/)(idem\w*)\b/g)) {
            if (!named.has(name)) named.set(name, await freshDatabase("docs"));
          }
          for (const [name, db] of named) {
            const fresh = new URL(db.url).pathname.slice(1);
            // The block's createdb makes it: drop the fresh one first so that it runs as written.
            if (new RegExp(`createdb [^\\n]*-U postgres ${name}\\b`).test(code)) await db.drop();
            code = code.replace(
              new RegExp(`(-U postgres |127\\.0\\.0\\.1:5432/)${name}\\b`, "g"),
              `$1${fresh}`,
            );
          }
          const where = `${b.doc}:${b.line}`;
          if (startsService(code) || code.includes("npm start")) {
            if (service) await stopGroup(service.child);
            service = undefined;
          }
          if (startsService(code)) {
            service = bash(code, env);
            await healthy(service.child, port, service.output);
            continue;
          }
          if (code.includes(`:${port}`) && !service && !code.includes("npm start")) {
            service = bash("npm start", { ...env, IDEM_DEMO: "1" });
            await healthy(service.child, port, service.output);
          }
          const run = bash(code, env);
          const status = await finished(run.child, 90_000);
          await stopGroup(run.child);
          expect(status, `${where} exited ${status}:\n${code}\n---\n${run.output()}`).toBe(0);
          // A reply the block shows in a comment (`# 400 {"type":"urn:idem:problem:...`) is the reply.
          for (const shown of code.matchAll(/^#\s*\d{3} (\{"type":"[^"]+")/gm)) {
            expect(run.output(), where).toContain(shown[1]);
          }
        }
        if (!hadReport && existsSync("verify-report.json")) {
          // docs/verify.md's CI job writes its report here: it says every invariant held.
          expect(JSON.parse(readFileSync("verify-report.json", "utf8"))).toMatchObject({ ok: true });
        }
      } finally {
        if (service) await stopGroup(service.child);
        if (!hadReport) rmSync("verify-report.json", { force: true });
        for (const db of [main, ...named.values()]) await db.drop();
      }
    }, 240_000);
  },
);
