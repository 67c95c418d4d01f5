/**
 * The default breaker tells lost replies from an outage (issue 14): many replies lost at once are
 * retried to a definite answer, while a server nobody can reach opens the circuit quickly. Both run
 * with the client's DEFAULT options against real sockets on 127.0.0.1.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import {
  CircuitState,
  createClient,
  isCircuitOpenError,
  isGiveUpError,
  isRetryBudgetExhaustedError,
} from "../../src/client/index.ts";

let server: Server | undefined;
afterEach(async () => {
  if (!server) return;
  const s = server;
  server = undefined;
  s.closeAllConnections();
  await new Promise<void>((resolve) => s.close(() => resolve()));
});

/**
 * A payment endpoint that dedups by key like an idem server: the first attempt of each key is
 * executed, its answer saved, and then its socket destroyed (the reply is lost); later attempts
 * replay the saved answer.
 */
async function losingFirstReplies(): Promise<{ url: string; executions: Map<string, number> }> {
  const executions = new Map<string, number>();
  const saved = new Map<string, string>();
  server = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      const key = String(req.headers["idempotency-key"] ?? "");
      const replay = saved.get(key);
      if (replay !== undefined) {
        res.writeHead(201, { "content-type": "application/json", "idempotent-replayed": "true" });
        res.end(replay);
        return;
      }
      executions.set(key, (executions.get(key) ?? 0) + 1);
      saved.set(key, JSON.stringify({ payment: executions.size }));
      req.socket.destroy(); // processed, then the reply is lost
    });
  });
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, executions };
}

/** A port on 127.0.0.1 with nothing listening on it. */
async function deadPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((resolve) => s.listen(0, "127.0.0.1", resolve));
  const { port } = s.address() as AddressInfo;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}

describe("the default breaker", () => {
  it("200 concurrent calls, each losing its first reply after the server processed it: all 201, one execution each", async () => {
    const { url, executions } = await losingFirstReplies();
    const client = createClient({ baseUrl: url }); // default options
    const results = await Promise.allSettled(
      Array.from({ length: 200 }, (_, i) => client.post("/payments", { amount_cents: 100 + i })),
    );
    const statuses = await Promise.all(
      results.map(async (r) => {
        if (r.status === "rejected") return (r.reason as Error).name;
        await r.value.arrayBuffer();
        return r.value.status;
      }),
    );
    expect(statuses.filter((s) => s !== 201)).toEqual([]);
    expect(executions.size).toBe(200);
    expect([...executions.values()].every((n) => n === 1)).toBe(true);
    expect(client.breaker?.state).toBe(CircuitState.closed);
    expect(await client.pending()).toEqual([]);
  }, 60_000);

  it("a total outage (nothing listening) opens the circuit within a second, then calls fail fast", async () => {
    const port = await deadPort();
    let sent = 0;
    let openedAfterMs: number | undefined;
    const started = Date.now();
    const client = createClient({
      baseUrl: `http://127.0.0.1:${port}`,
      // Counts what really goes out; the client's own options stay the defaults.
      fetch: (u, init) => {
        sent++;
        return fetch(u, init);
      },
      breaker: {
        onStateChange: ({ to }) => {
          if (to === CircuitState.open) openedAfterMs ??= Date.now() - started;
        },
      },
    });
    const calls = await Promise.allSettled(
      Array.from({ length: 20 }, (_, i) => client.post("/payments", { amount_cents: i })),
    );
    console.log(
      `total outage: breaker open after ${openedAfterMs} ms and ${sent} attempts (20 concurrent calls)`,
    );
    expect(openedAfterMs).toBeDefined();
    expect(openedAfterMs!).toBeLessThan(1_000);
    expect(client.breaker?.state).toBe(CircuitState.open);
    // Every call gave up early, stopped by the breaker or by the budget (its outcome unknown, so its
    // intent stays pending): none hung, none spent its five attempts.
    const reasons = calls.map((c) => {
      const err = c.status === "rejected" ? c.reason : undefined;
      expect(isGiveUpError(err)).toBe(true);
      return isCircuitOpenError(err) ? "circuit" : isRetryBudgetExhaustedError(err) ? "budget" : err?.name;
    });
    expect(reasons.filter((r) => r !== "circuit" && r !== "budget")).toEqual([]);
    expect(reasons).toContain("circuit");
    expect((await client.pending()).length).toBe(20);
    // Open: the next call is refused without a connection attempt.
    const before = sent;
    const err = await client.post("/payments", {}).catch((e) => e);
    expect(isCircuitOpenError(err)).toBe(true);
    expect(err.attempts).toBe(0);
    expect(sent).toBe(before);
  }, 60_000);
});

describe("a retry the budget refuses, after a reply that did not come back in time", () => {
  /**
   * A payment endpoint that executes each key once and answers it after `slowMs` (past the client's
   * per-try timeout); with `lookup`, `GET /v1/operations` with the key gives the saved answer, as
   * idem's lookup does.
   */
  async function slowServer(lookup: boolean) {
    const executions = new Map<string, number>();
    const saved = new Map<string, string>();
    let lookups = 0;
    server = createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        const key = String(req.headers["idempotency-key"] ?? "");
        if (req.method === "GET" && req.url?.startsWith("/v1/operations")) {
          lookups++;
          const body = saved.get(key);
          if (!lookup || body === undefined) {
            res.writeHead(404, { "content-type": "text/plain" }).end("no such route");
            return;
          }
          res.writeHead(201, {
            "content-type": "application/json",
            "idempotent-replayed": "true",
            "idempotency-operation-ref": `op_${key}`,
            "idempotency-operation-state": "done",
          });
          res.end(body);
          return;
        }
        if (saved.has(key)) {
          res.writeHead(201, { "content-type": "application/json", "idempotent-replayed": "true" });
          res.end(saved.get(key));
          return;
        }
        executions.set(key, (executions.get(key) ?? 0) + 1);
        saved.set(key, JSON.stringify({ payment: executions.size }));
        setTimeout(() => res.writeHead(201).end(saved.get(key)), 400); // after the client gave up
      });
    });
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    return { url, executions, lookups: () => lookups };
  }

  it("asks the operation lookup (no new work) and returns the saved answer", async () => {
    const s = await slowServer(true);
    const client = createClient({ baseUrl: s.url, perTryTimeoutMs: 150, budget: { cap: 0, ratio: 0 } });
    const res = await client.post("/v1/payments", { amount_cents: 1 });
    expect(res.status).toBe(201);
    expect(res.headers.get("idempotent-replayed")).toBe("true");
    expect(await res.json()).toEqual({ payment: 1 });
    expect([...s.executions.values()]).toEqual([1]);
    expect(s.lookups()).toBe(1);
  });

  it("without a lookup on the server, the budget still refuses the retry (it would be new work)", async () => {
    const s = await slowServer(false);
    const client = createClient({ baseUrl: s.url, perTryTimeoutMs: 150, budget: { cap: 0, ratio: 0 } });
    const err = await client.post("/v1/payments", { amount_cents: 1 }).catch((e) => e);
    expect(isRetryBudgetExhaustedError(err)).toBe(true);
    expect(s.lookups()).toBe(1);
  });
});
