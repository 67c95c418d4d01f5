/**
 * How long the client waits: Retry-After first, full-jitter backoff otherwise, never past the deadline.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { backoffCeilingMs, fullJitterMs } from "../../src/client/backoff.ts";
import { createClient, DeadlineReason, type WaitEvent } from "../../src/client/index.ts";
import { parseRetryAfter } from "../../src/client/retry-after.ts";
import { scriptedFetch, socketError } from "./helpers.ts";

describe("Retry-After", () => {
  const now = Date.parse("2025-01-01T00:00:00Z");
  it("reads seconds", () => {
    expect(parseRetryAfter("1", now)).toBe(1000);
    expect(parseRetryAfter(" 120 ", now)).toBe(120_000);
    expect(parseRetryAfter("0", now)).toBe(0);
  });
  it("reads an HTTP date, and a date in the past means now", () => {
    expect(parseRetryAfter("Wed, 01 Jan 2025 00:00:30 GMT", now)).toBe(30_000);
    expect(parseRetryAfter("Tue, 31 Dec 2024 23:00:00 GMT", now)).toBe(0);
  });
  it("ignores what it cannot read", () => {
    for (const v of [null, undefined, "", "-1", "soon", "1e3", "12abc"]) {
      expect(parseRetryAfter(v, now)).toBeUndefined();
    }
  });
});

describe("full-jitter backoff", () => {
  it("doubles the ceiling per attempt from 2x base, up to the cap", () => {
    expect([1, 2, 3, 4, 5, 6, 60].map((n) => backoffCeilingMs(n))).toEqual([
      400, 800, 1600, 3200, 5000, 5000, 5000,
    ]);
    expect(backoffCeilingMs(3, { baseMs: 10, capMs: 50 })).toBe(50);
  });
  it("picks uniformly between 0 and the ceiling", () => {
    expect(fullJitterMs(2, {}, () => 0)).toBe(0);
    expect(fullJitterMs(2, {}, () => 0.5)).toBe(400);
    for (let i = 0; i < 1000; i++) {
      const w = fullJitterMs(3);
      expect(w).toBeGreaterThanOrEqual(0);
      expect(w).toBeLessThan(1600);
    }
  });
});

describe("waiting between attempts (fake timers)", () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it("waits the jittered backoff, and the second attempt goes out only when it is over", async () => {
    const server = scriptedFetch((n) => new Response(null, { status: n < 3 ? 503 : 201 }));
    const waits: WaitEvent[] = [];
    const client = createClient({
      fetch: server.fetch,
      retry: { random: () => 0.5 },
      on: { wait: (e) => waits.push(e) },
    });
    const call = client.post("http://api.test/p", {});
    await vi.advanceTimersByTimeAsync(199);
    expect(server.calls).toHaveLength(1);
    await vi.advanceTimersByTimeAsync(1);
    expect(server.calls).toHaveLength(2);
    await vi.advanceTimersByTimeAsync(400);
    expect((await call).status).toBe(201);
    expect(waits.map((w) => [w.source, w.delayMs])).toEqual([
      ["backoff", 200],
      ["backoff", 400],
    ]);
  });

  it("the server's Retry-After (as a date) replaces the backoff", async () => {
    const server = scriptedFetch((n) =>
      n === 1
        ? new Response(null, {
            status: 503,
            headers: { "retry-after": new Date(Date.now() + 3_000).toUTCString() },
          })
        : new Response(null, { status: 201 }),
    );
    const waits: WaitEvent[] = [];
    const client = createClient({ fetch: server.fetch, on: { wait: (e) => waits.push(e) } });
    const call = client.post("http://api.test/p", {});
    await vi.advanceTimersByTimeAsync(3_000);
    expect((await call).status).toBe(201);
    expect(waits[0]?.source).toBe("retry-after");
    expect(waits[0]?.delayMs).toBeGreaterThan(2_000);
    expect(waits[0]?.delayMs).toBeLessThanOrEqual(3_000);
  });

  it("does not start a backoff wait that would outlast the deadline", async () => {
    const server = scriptedFetch(() => Promise.reject(socketError()));
    const client = createClient({
      fetch: server.fetch,
      deadlineMs: 1_000,
      retry: { baseMs: 1_000, random: () => 0.9 },
    });
    const err = await client.post("http://api.test/p", {}).catch((e) => e);
    expect(err.code).toBe("IDEM_DEADLINE_EXCEEDED");
    expect(err.reason).toBe(DeadlineReason.waitTooLong);
    expect(err.waitMs).toBe(1_800);
    expect(err.lastError.cause.code).toBe("UND_ERR_SOCKET");
    expect(server.calls).toHaveLength(1);
  });

  it("one deadline covers every attempt and wait", async () => {
    const server = scriptedFetch(() => Promise.reject(socketError()));
    const client = createClient({
      fetch: server.fetch,
      deadlineMs: 2_000,
      breaker: false,
      budget: false,
      maxAttempts: 100,
      retry: { baseMs: 100, capMs: 100, random: () => 0.999 },
    });
    const call = client.post("http://api.test/p", {}).catch((e) => e);
    await vi.advanceTimersByTimeAsync(2_000);
    const err = await call;
    expect(err.code).toBe("IDEM_DEADLINE_EXCEEDED");
    // ~100 ms per wait: about 20 attempts fit in 2 s, never more.
    expect(server.calls.length).toBeGreaterThanOrEqual(19);
    expect(server.calls.length).toBeLessThanOrEqual(21);
  });

  it("a per-try timeout aborts the attempt and retries it", async () => {
    const server = scriptedFetch((n, init) =>
      n === 1
        ? new Promise<Response>((_r, reject) =>
            init.signal?.addEventListener("abort", () => reject(init.signal?.reason)),
          )
        : new Response(null, { status: 201 }),
    );
    const client = createClient({ fetch: server.fetch, perTryTimeoutMs: 500, retry: { random: () => 0 } });
    const call = client.post("http://api.test/p", {});
    await vi.advanceTimersByTimeAsync(499);
    expect(server.calls).toHaveLength(1);
    await vi.advanceTimersByTimeAsync(10);
    expect((await call).status).toBe(201);
    expect(server.calls).toHaveLength(2);
    const keys = server.calls.map((c) => new Headers(c.headers).get("idempotency-key"));
    expect(keys[0]).toBe(keys[1]);
  });

  it("the giveUp hook sees the key and the typed error", async () => {
    const server = scriptedFetch(() => new Response(null, { status: 429, headers: { "retry-after": "60" } }));
    const seen: unknown[] = [];
    const client = createClient({ fetch: server.fetch, on: { giveUp: (e) => seen.push(e) } });
    const intent = await client.intent("i-1");
    await client.post("http://api.test/p", {}, { intent }).catch(() => {});
    expect(seen).toMatchObject([
      { intentId: "i-1", key: intent.key, attempts: 1, error: { code: "IDEM_DEADLINE_EXCEEDED" } },
    ]);
  });
});
