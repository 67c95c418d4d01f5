/**
 * The embedded database directory belongs to one process at a time: PGlite is PostgreSQL in one process,
 * and a second `npm start` (or an `idem sweep`) writing the same directory would corrupt it.
 */
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { start } from "../../app/main.ts";
import { CliError } from "../../src/cli/shared.ts";
import { sweepCommand } from "../../src/cli/sweep.ts";
import { DataDirInUseError, lockDataDir } from "../../src/postgres/drivers/pglite.ts";

const root = mkdtempSync(join(tmpdir(), "idem-data-dir-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("the embedded database directory", () => {
  it("is locked by one process; a second one is refused until the first lets go", async () => {
    const dir = join(root, "lib");
    mkdirSync(dir, { recursive: true });
    const release = await lockDataDir(dir);
    const second = await lockDataDir(dir).catch((e) => e);
    expect(second).toBeInstanceOf(DataDirInUseError);
    expect(second.message).toContain("IDEM_DATA_DIR");
    await release();
    const again = await lockDataDir(dir);
    await again();
  });

  it("refuses a second service and `idem sweep` on the directory a running service uses", async () => {
    const dir = join(root, "service");
    const env = { IDEM_DATA_DIR: dir, PORT: "0", PROVIDER_PORT: "0", LOG_LEVEL: "silent" };
    const first = await start(env);
    try {
      const second = await start(env).catch((e) => e);
      expect(second).toBeInstanceOf(DataDirInUseError);
      // The command on the embedded database (no DATABASE_URL), like `idem sweep` next to `npm start`.
      const saved = { dir: process.env.IDEM_DATA_DIR, url: process.env.DATABASE_URL };
      process.env.IDEM_DATA_DIR = dir;
      delete process.env.DATABASE_URL;
      try {
        const sweep = await sweepCommand([]).catch((e) => e);
        expect(sweep).toBeInstanceOf(CliError);
        expect(sweep.message).toMatch(/open in another process.*IDEM_DATA_DIR/);
      } finally {
        if (saved.dir === undefined) delete process.env.IDEM_DATA_DIR;
        else process.env.IDEM_DATA_DIR = saved.dir;
        if (saved.url !== undefined) process.env.DATABASE_URL = saved.url;
      }
      // The first one still serves.
      const health = await fetch(`http://127.0.0.1:${first.port}/health`);
      expect(health.status).toBe(200);
    } finally {
      await first.stop();
    }
    // Once it has stopped, the directory is free again.
    const next = await start(env);
    await next.stop();
  }, 60_000);
});
