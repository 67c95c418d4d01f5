/**
 * The circuit breaker, with fake timers: opens, fails fast, probes, closes.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { CircuitBreaker, CircuitState, createClient, isCircuitOpenError } from "../../src/client/index.ts";
import { refusedError, scriptedFetch } from "./helpers.ts";

beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

function deferred<T>() {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

/** One attempt per call, no budget: each call is one breaker verdict. */
function oneShotClient(
  fetch: (url: string, init: RequestInit) => Promise<Response>,
  breaker: CircuitBreaker,
) {
  return createClient({ fetch, breaker, budget: false, maxAttempts: 1 });
}

describe("circuit breaker", () => {
  it("opens after the configured failures in a row and then fails fast without sending", async () => {
    const server = scriptedFetch(() => new Response(null, { status: 503 }));
    const breaker = new CircuitBreaker({ consecutiveFailures: 3, openMs: 1_000 });
    const client = oneShotClient(server.fetch, breaker);
    for (let i = 0; i < 3; i++) {
      await expect(client.post("http://api.test/p", {})).rejects.toMatchObject({
        code: "IDEM_ATTEMPTS_EXHAUSTED",
      });
    }
    expect(breaker.state).toBe(CircuitState.open);

    const started = Date.now();
    const err = await client.post("http://api.test/p", {}).catch((e) => e);
    expect(isCircuitOpenError(err)).toBe(true);
    expect(err.retryInMs).toBe(1_000);
    expect(err.attempts).toBe(0);
    expect(Date.now() - started).toBe(0);
    expect(server.calls).toHaveLength(3);
  });

  it("gives up mid-call with the last response when the circuit opens between retries", async () => {
    const server = scriptedFetch(() => new Response("down", { status: 503 }));
    const client = createClient({
      fetch: server.fetch,
      breaker: { consecutiveFailures: 2 },
      retry: { baseMs: 1, random: () => 0 },
    });
    const call = client.post("http://api.test/p", {}).catch((e) => e);
    await vi.advanceTimersByTimeAsync(10);
    const err = await call;
    expect(isCircuitOpenError(err)).toBe(true);
    expect(err.attempts).toBe(2);
    expect(err.lastResponse.status).toBe(503);
  });

  it("half-open lets one probe through, fails fast for the others, and closes when it succeeds", async () => {
    let healthy = false;
    const probe = deferred<Response>();
    const server = scriptedFetch(() => (healthy ? probe.promise : Promise.reject(refusedError())));
    const breaker = new CircuitBreaker({ consecutiveFailures: 2, openMs: 5_000 });
    const client = oneShotClient(server.fetch, breaker);
    await client.post("http://api.test/p", {}).catch(() => {});
    await client.post("http://api.test/p", {}).catch(() => {});
    expect(breaker.state).toBe(CircuitState.open);

    await vi.advanceTimersByTimeAsync(4_999);
    await expect(client.post("http://api.test/p", {})).rejects.toMatchObject({ code: "IDEM_CIRCUIT_OPEN" });
    await vi.advanceTimersByTimeAsync(1);
    expect(breaker.state).toBe(CircuitState.halfOpen);

    healthy = true;
    const first = client.post("http://api.test/p", {});
    await vi.advanceTimersByTimeAsync(0);
    const second = await client.post("http://api.test/p", {}).catch((e) => e);
    expect(isCircuitOpenError(second)).toBe(true);
    expect(second.retryInMs).toBe(0);

    probe.resolve(new Response("ok", { status: 201 }));
    expect((await first).status).toBe(201);
    expect(breaker.state).toBe(CircuitState.closed);
    expect((await client.post("http://api.test/p", {})).status).toBe(201);
  });

  it("a failed probe opens the circuit again for another interval", async () => {
    const server = scriptedFetch(() => new Response(null, { status: 500 }));
    const breaker = new CircuitBreaker({ consecutiveFailures: 1, openMs: 1_000 });
    const client = oneShotClient(server.fetch, breaker);
    await client.post("http://api.test/p", {}).catch(() => {});
    await vi.advanceTimersByTimeAsync(1_000);
    await client.post("http://api.test/p", {}).catch(() => {}); // the probe, fails
    expect(server.calls).toHaveLength(2);
    expect(breaker.state).toBe(CircuitState.open);
    expect(breaker.retryInMs()).toBe(1_000);
  });

  it("lets as many probes through as configured", async () => {
    const pending = deferred<Response>();
    let down = true;
    const server = scriptedFetch(() => (down ? Promise.reject(refusedError()) : pending.promise));
    const breaker = new CircuitBreaker({ consecutiveFailures: 1, openMs: 100, halfOpenProbes: 2 });
    const client = oneShotClient(server.fetch, breaker);
    await client.post("http://api.test/p", {}).catch(() => {});
    await vi.advanceTimersByTimeAsync(100);
    down = false;
    const probes = [client.post("http://api.test/p", {}), client.post("http://api.test/p", {})];
    await vi.advanceTimersByTimeAsync(0);
    await expect(client.post("http://api.test/p", {})).rejects.toMatchObject({ code: "IDEM_CIRCUIT_OPEN" });
    expect(server.calls).toHaveLength(3);
    pending.resolve(new Response(null, { status: 200 }));
    await Promise.all(probes);
    expect(breaker.state).toBe(CircuitState.closed);
  });

  it("opens on a failure rate over a window of recent attempts", async () => {
    let status = 200;
    const server = scriptedFetch(() => new Response(null, { status }));
    const breaker = new CircuitBreaker({ failureRate: 0.5, window: { attempts: 10 } });
    const client = oneShotClient(server.fetch, breaker);
    for (let i = 0; i < 5; i++) await client.post("http://api.test/p", {});
    status = 503;
    for (let i = 0; i < 5; i++) await client.post("http://api.test/p", {}).catch(() => {});
    expect(breaker.state).toBe(CircuitState.closed); // 5 of 10 is not more than half
    await client.post("http://api.test/p", {}).catch(() => {});
    expect(breaker.state).toBe(CircuitState.open); // 6 of the last 10
  });

  it("does not count 429s (a live server asking us to slow down) as failures", async () => {
    const server = scriptedFetch(() => new Response(null, { status: 429 }));
    const breaker = new CircuitBreaker({ consecutiveFailures: 2 });
    const client = oneShotClient(server.fetch, breaker);
    for (let i = 0; i < 5; i++) await client.post("http://api.test/p", {}).catch(() => {});
    expect(breaker.state).toBe(CircuitState.closed);
  });

  it("a caller's abort is neither a success nor a failure", async () => {
    const server = scriptedFetch(
      (_n, init) =>
        new Promise<Response>((_r, reject) =>
          init.signal?.addEventListener("abort", () => reject(init.signal?.reason)),
        ),
    );
    const changes: string[] = [];
    const breaker = new CircuitBreaker({ consecutiveFailures: 1, onStateChange: (c) => changes.push(c.to) });
    const client = oneShotClient(server.fetch, breaker);
    const controller = new AbortController();
    const call = client.post("http://api.test/p", {}, { signal: controller.signal }).catch((e) => e);
    await vi.advanceTimersByTimeAsync(0);
    controller.abort();
    expect((await call).code).toBe("IDEM_ABORTED");
    expect(changes).toEqual([]);
  });
});
