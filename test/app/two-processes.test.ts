/**
 * The service is stateless: two processes on one database behave as one. 100 concurrent requests with
 * one key, split across both, execute once.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DATABASE_URL, freshDatabase, sayWhySkippedWithoutServer } from "../helpers/db.ts";
import { listeningUrl, pay } from "./service.ts";

sayWhySkippedWithoutServer();

function startProcess(databaseUrl: string): Promise<{ url: string; child: ChildProcess }> {
  const child = spawn("node_modules/.bin/tsx", ["--conditions=source", "app/main.ts"], {
    env: {
      ...process.env,
      PORT: "0",
      DATABASE_URL: databaseUrl,
      IDEM_DEMO: "1",
      IDEM_PAYMENTS_MODE: "atomic",
      LOG_LEVEL: "warn",
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  return listeningUrl(child, 30_000).then((url) => ({ url, child }));
}

describe.runIf(DATABASE_URL)("two service processes on one database", () => {
  let fresh: Awaited<ReturnType<typeof freshDatabase>>;
  const children: ChildProcess[] = [];
  let urls: string[] = [];

  beforeAll(async () => {
    fresh = await freshDatabase();
    // Both start (and migrate) at the same moment.
    const started = await Promise.all([startProcess(fresh.url), startProcess(fresh.url)]);
    children.push(...started.map((s) => s.child));
    urls = started.map((s) => s.url);
  });
  afterAll(async () => {
    await Promise.all(
      children.map(
        (c) =>
          new Promise((r) => {
            if (c.exitCode !== null) return r(null);
            c.once("exit", r);
            c.kill("SIGTERM");
          }),
      ),
    );
    await fresh?.drop();
  });

  it("executes 100 concurrent requests with one key once, across both processes", async () => {
    const key = randomUUID();
    const replies = await Promise.all(Array.from({ length: 100 }, (_, i) => pay(urls[i % 2]!, { key })));
    expect(replies.map((r) => r.status)).toEqual(Array(100).fill(201));
    expect(new Set(await Promise.all(replies.map((r) => r.text()))).size).toBe(1);
    const pg = await import("pg");
    const client = new pg.default.Client({ connectionString: fresh.url });
    await client.connect();
    const { rows } = await client.query("SELECT count(*)::int AS n FROM payments");
    await client.end();
    expect(rows[0].n).toBe(1);
  });
});
