/**
 * The service survives its database going away, again and again: a service process on a PostgreSQL
 * server of its own, under steady payments, while the server is restarted three times. The process
 * never exits (no unhandled 'error' from a pool, the LISTEN connection, the relay or the completer),
 * answers 503 problem+json with Retry-After while the database is down (never 500), and recovers by
 * itself: afterwards payments succeed again.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Cluster, clusterUnavailable, startCluster } from "../helpers/cluster.ts";
import { KEY_1 } from "./service.ts";

const unavailable = clusterUnavailable();

describe.skipIf(unavailable)("the service across PostgreSQL restarts", () => {
  let cluster: Cluster;
  let child: ChildProcess;
  let url: string;
  let output = "";

  beforeAll(async () => {
    cluster = await startCluster("restarts");
    child = spawn(process.execPath, ["--conditions=source", "--import", "tsx", "app/main.ts"], {
      env: {
        ...process.env,
        DATABASE_URL: cluster.url,
        IDEM_DEMO: "1",
        PORT: "0",
        PROVIDER_PORT: "0",
        IDEM_POOL_SIZE: "5",
        LOG_LEVEL: "warn",
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    child.stdout!.on("data", (d) => {
      output += d;
    });
    child.stderr!.on("data", (d) => {
      output += d;
    });
    url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`the service did not start: ${output}`)), 60_000);
      const check = () => {
        const m = /payments service on (http:\/\/127\.0\.0\.1:\d+)/.exec(output);
        if (m) {
          clearTimeout(timer);
          resolve(m[1]!);
        }
      };
      child.stdout!.on("data", check);
      child.once("exit", (code) => reject(new Error(`the service exited with ${code}: ${output}`)));
    });
  }, 120_000);

  afterAll(async () => {
    if (child && child.exitCode === null) {
      child.kill("SIGTERM");
      await new Promise((r) => child.once("exit", r));
    }
    await cluster?.stop();
  });

  const pay = async (): Promise<{ status: number; retryAfter: string | null; type?: string }> => {
    try {
      const res = await fetch(`${url}/v1/payments`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${KEY_1}`,
          "idempotency-key": randomUUID(),
          "content-type": "application/json",
        },
        body: JSON.stringify({ amount_cents: 700, currency: "eur" }),
        signal: AbortSignal.timeout(20_000),
      });
      const text = await res.text();
      let type: string | undefined;
      try {
        type = (JSON.parse(text) as { type?: string }).type;
      } catch {
        type = undefined;
      }
      return { status: res.status, retryAfter: res.headers.get("retry-after"), type };
    } catch {
      return { status: 0, retryAfter: null }; // no answer at all (the process is gone, or a timeout)
    }
  };

  it("never exits, answers 503 with Retry-After while the database is down, and recovers", async () => {
    const seen: Array<{ status: number; retryAfter: string | null; type?: string }> = [];
    let stop = false;
    const workers = Array.from({ length: 4 }, async () => {
      while (!stop) {
        seen.push(await pay());
        await new Promise((r) => setTimeout(r, 20));
      }
    });
    for (let i = 0; i < 3; i++) {
      await new Promise((r) => setTimeout(r, 1_500));
      await cluster.restart();
      expect(child.exitCode, `the service exited during restart ${i + 1}: ${output}`).toBeNull();
    }
    await new Promise((r) => setTimeout(r, 1_500));
    stop = true;
    await Promise.all(workers);

    expect(child.exitCode, output).toBeNull();
    const byStatus: Record<string, number> = {};
    for (const s of seen) byStatus[s.status] = (byStatus[s.status] ?? 0) + 1;
    console.log(`payments across 3 PostgreSQL restarts: ${JSON.stringify(byStatus)}`);
    const errors = output
      .split("\n")
      .filter((l) => l.includes('"level":50'))
      .slice(0, 5);
    expect(byStatus["500"] ?? 0, `${JSON.stringify(byStatus)}\n${errors.join("\n")}`).toBe(0);
    expect(byStatus["0"] ?? 0, "requests that got no answer at all").toBe(0);
    for (const s of seen.filter((x) => x.status === 503)) expect(s.retryAfter).not.toBeNull();

    // Recovered by itself: the health check and a payment succeed within a few seconds.
    let healthy = false;
    for (let i = 0; i < 40 && !healthy; i++) {
      healthy = (await fetch(`${url}/health`).catch(() => undefined))?.status === 200;
      if (!healthy) await new Promise((r) => setTimeout(r, 250));
    }
    expect(healthy).toBe(true);
    let paid = 0;
    for (let i = 0; i < 20 && paid < 5; i++) if ((await pay()).status === 201) paid++;
    expect(paid).toBe(5);
    expect(child.exitCode).toBeNull();
  }, 240_000);
});
