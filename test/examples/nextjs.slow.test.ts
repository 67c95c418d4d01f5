/**
 * The Next.js example (examples/nextjs: an App Router route handler on idem/web), as a user gets it:
 * idem packed (`npm pack`) and installed beside next, react and pg from the npm registry, built with
 * `next build`, served with `next start`, and called twice with one key: one payment, the same answer.
 */
import { execFile, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import { freshDatabase, sayWhySkippedWithoutServer } from "../helpers/db.ts";
import { freeLoopbackPort } from "../helpers/ports.ts";

const run = promisify(execFile);
const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const EXAMPLE = join(ROOT, "examples", "nextjs");
const npm = process.platform === "win32" ? "npm.cmd" : "npm";

sayWhySkippedWithoutServer();
describe.skipIf(!process.env.DATABASE_URL)("Next.js App Router example", () => {
  const cleanup: Array<() => unknown> = [];
  afterAll(async () => {
    for (const c of cleanup.reverse()) await c();
  });

  it("builds with next build and runs a keyed payment once, replaying its answer", async () => {
    const packDir = mkdtempSync(join(tmpdir(), "idem-pack-"));
    cleanup.push(() => rmSync(packDir, { recursive: true, force: true }));
    const { stdout } = await run(npm, ["pack", "--silent", "--pack-destination", packDir], {
      cwd: ROOT,
      maxBuffer: 1 << 24,
    });
    const tarball = join(packDir, stdout.trim().split("\n").pop()!);
    await run(npm, ["install", "--no-save", "--no-package-lock", "--no-audit", "--no-fund", tarball], {
      cwd: EXAMPLE,
      maxBuffer: 1 << 24,
    });
    await run("npx", ["next", "build"], {
      cwd: EXAMPLE,
      env: { ...process.env, NEXT_TELEMETRY_DISABLED: "1" },
      maxBuffer: 1 << 24,
    });

    const db = await freshDatabase();
    cleanup.push(() => db.drop());
    const port = await freeLoopbackPort();
    const server = spawn("npx", ["next", "start", "-H", "127.0.0.1", "-p", String(port)], {
      cwd: EXAMPLE,
      env: { ...process.env, DATABASE_URL: db.url, NEXT_TELEMETRY_DISABLED: "1" },
      stdio: "ignore",
      detached: true, // its own process group: npx and next go together
    });
    cleanup.push(() => {
      try {
        process.kill(-server.pid!, "SIGKILL");
      } catch {}
    });
    const base = `http://127.0.0.1:${port}/api/payments`;
    for (let i = 0; ; i++) {
      const up = await fetch(`http://127.0.0.1:${port}/`).then(
        () => true, // any answer: the server is up
        () => false,
      );
      if (up) break;
      if (i > 300) throw new Error("next start did not answer");
      await new Promise((r) => setTimeout(r, 100));
    }
    const key = randomUUID();
    const pay = () =>
      fetch(base, {
        method: "POST",
        headers: { "x-account": "acct_next", "idempotency-key": key, "content-type": "application/json" },
        body: JSON.stringify({ amount_cents: 5000 }),
      });
    const first = await pay();
    const firstBody = await first.text();
    const again = await pay();
    expect(first.status).toBe(201);
    expect(again.status).toBe(201);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(await again.text()).toBe(firstBody);
    const count = (await (await fetch(`${base}?account=acct_next`)).json()) as { n: number };
    expect(count.n).toBe(1);
  }, 600_000);
});
