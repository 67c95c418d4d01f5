/**
 * The service as an operator runs it (`npm start`, a real process): signals reach it and it drains,
 * a taken port names the setting to change, sockets that never send a byte are closed, the connection
 * cap holds, and /metrics can be protected with a token.
 */
import { type ChildProcess, execFile, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { KEY_1 } from "./service.ts";

const run = promisify(execFile);
const dirs: string[] = [];
const children: ChildProcess[] = [];

afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null) c.kill("SIGKILL");
});
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function dataDir(): string {
  const d = mkdtempSync(join(tmpdir(), "idem-process-"));
  dirs.push(d);
  return join(d, "pgdata");
}

interface Started {
  child: ChildProcess;
  url: string;
  output(): string;
  exited: Promise<number | null>;
}

/** `npm start` with the embedded database in a directory of its own, on free ports. */
function npmStart(env: Record<string, string>): Promise<Started> {
  const child = spawn("npm", ["start", "--silent"], {
    env: {
      ...process.env,
      DATABASE_URL: "",
      PORT: "0",
      PROVIDER_PORT: "0",
      IDEM_DATA_DIR: dataDir(),
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.push(child);
  let out = "";
  child.stdout!.on("data", (d) => {
    out += d;
  });
  child.stderr!.on("data", (d) => {
    out += d;
  });
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the service did not start: ${out}`)), 60_000);
    const onData = () => {
      const m = /payments service on (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        child.stdout!.off("data", onData);
        resolve({ child, url: m[1]!, output: () => out, exited });
      }
    };
    child.stdout!.on("data", onData);
    exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`the service exited with ${code}: ${out}`));
    });
  });
}

/** The pids of the processes `npm` started (its children). */
async function childrenOf(pid: number): Promise<number[]> {
  const { stdout } = await run("ps", ["-eo", "pid=,ppid="]);
  return stdout
    .split("\n")
    .map((l) => l.trim().split(/\s+/).map(Number))
    .filter(([, ppid]) => ppid === pid)
    .map(([p]) => p!);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe("the service process", () => {
  it("drains a request in flight on SIGTERM, logs the shutdown, and leaves no process behind", async () => {
    // A provider that takes 1.5 s per charge, so a payment is in flight when the signal comes. The CLI's
    // sources are run directly, not through bin/idem.js: that wrapper runs them in a child of its own,
    // which the SIGKILL of the clean-up would leave running.
    const provider = spawn(
      process.execPath,
      [
        "--conditions=source",
        "--import",
        "tsx",
        "src/cli/main.ts",
        "provider",
        "--port",
        "0",
        "--latency-ms",
        "1500",
      ],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    children.push(provider);
    const providerUrl = await new Promise<string>((resolve, reject) => {
      let out = "";
      provider.stdout!.on("data", (d) => {
        out += d;
        const m = /on (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
        if (m) resolve(m[1]!);
      });
      provider.once("exit", (code) => reject(new Error(`provider exited ${code}: ${out}`)));
    });
    const svc = await npmStart({ PROVIDER_URL: providerUrl, LOG_LEVEL: "info" });
    const service = await childrenOf(svc.child.pid!);
    expect(service.length).toBeGreaterThan(0);

    const paying = fetch(`${svc.url}/v1/payments`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${KEY_1}`,
        "idempotency-key": randomUUID(),
        "content-type": "application/json",
      },
      body: JSON.stringify({ amount_cents: 1234, currency: "eur" }),
    });
    await new Promise((r) => setTimeout(r, 400)); // the charge is at the provider now
    svc.child.kill("SIGTERM"); // npm's own pid: npm forwards the signal to the service
    const res = await paying;
    expect(res.status).toBe(201);
    expect(await svc.exited).toBe(0);
    const out = svc.output();
    expect(out).toContain("shutdown began");
    expect(out).toContain("shutdown ended");
    expect(out.indexOf("shutdown began")).toBeLessThan(out.indexOf("shutdown ended"));
    await new Promise((r) => setTimeout(r, 200));
    for (const pid of service) expect(alive(pid)).toBe(false); // no orphaned node after npm exited
  }, 120_000);

  it("names PORT when its port is taken, and PROVIDER_PORT when the simulator's is", async () => {
    const blocker: Server = createServer();
    await new Promise<void>((r) => blocker.listen(0, "127.0.0.1", () => r()));
    const taken = String((blocker.address() as { port: number }).port);
    try {
      await expect(npmStart({ PORT: taken })).rejects.toThrow(
        /port \d+ is already in use.*set PORT to another/,
      );
      await expect(npmStart({ PROVIDER_PORT: taken })).rejects.toThrow(
        /port \d+ is already in use.*set PROVIDER_PORT to another/,
      );
      await expect(npmStart({ PORT: "70000" })).rejects.toThrow(/PORT must be a port number from 0 to 65535/);
      // An admin token of fewer than 128 bits, in any form, stops the start naming the setting.
      await expect(npmStart({ IDEM_ADMIN_TOKEN: "x" })).rejects.toThrow(/IDEM_ADMIN_TOKEN: .*too weak/);
    } finally {
      blocker.close();
    }
  }, 120_000);

  it("closes sockets that never send a byte, caps connections, and guards /metrics with a token", async () => {
    const svc = await npmStart({
      IDEM_HTTP_HEADERS_TIMEOUT_MS: "1000",
      IDEM_HTTP_REQUEST_TIMEOUT_MS: "2000",
      IDEM_HTTP_MAX_CONNECTIONS: "20",
      IDEM_METRICS_TOKEN: "s3cret",
      LOG_LEVEL: "warn",
    });
    const { port } = new URL(svc.url);
    const net = await import("node:net");
    // 30 silent sockets: at most 20 are kept (the cap), and all are gone after the request timeout.
    const sockets = Array.from({ length: 30 }, () => {
      const s = net.connect(Number(port), "127.0.0.1");
      s.on("error", () => {}); // the ones over the cap are reset
      s.resume(); // read the 408, so that the close is seen
      return s;
    });
    const closedAt = sockets.map(
      (s) => new Promise<number>((resolve) => s.once("close", () => resolve(Date.now()))),
    );
    const started = Date.now();
    const times = await Promise.all(closedAt);
    for (const t of times) expect(t - started).toBeLessThan(10_000);
    // The service still answers afterwards.
    const health = await fetch(`${svc.url}/health`);
    expect(health.status).toBe(200);

    const open = await fetch(`${svc.url}/metrics`);
    expect(open.status).toBe(401);
    expect(open.headers.get("content-type")).toBe("application/problem+json");
    const scraped = await fetch(`${svc.url}/metrics`, { headers: { authorization: "Bearer s3cret" } });
    expect(scraped.status).toBe(200);
    expect(await scraped.text()).toContain("idem_http_requests_total");
    svc.child.kill("SIGTERM");
    expect(await svc.exited).toBe(0);
  }, 120_000);
});
