/**
 * The call's deadline, the per-try timeout and the caller's AbortSignal (issue 21), seen through the
 * public client: what stops a call, with which error, and that a finished call leaves nothing behind
 * (no timer, no listener on the caller's signal). `fetch` is the client's `fetch` option, answering
 * from a script, so the fake clock drives every timer.
 */
import { getEventListeners } from "node:events";
import { afterEach, describe, expect, it, vi } from "vitest";
import {
  CallAbortedError,
  createClient,
  DeadlineExceededError,
  type FetchLike,
} from "../../src/client/index.ts";

afterEach(() => {
  vi.useRealTimers();
});

const created = () =>
  new Response('{"id":1}', { status: 201, headers: { "content-type": "application/json" } });
const unavailable = (retryAfter: string) =>
  new Response(null, { status: 503, headers: { "retry-after": retryAfter } });

/** A fetch that never answers until its signal fires, then rejects with the signal's reason. */
function hangingFetch(seen: Array<AbortSignal | null | undefined>): FetchLike {
  return (_url, init) => {
    seen.push(init.signal);
    return new Promise((_resolve, reject) => {
      init.signal?.addEventListener("abort", () => reject(init.signal?.reason));
    });
  };
}

describe("a finished call leaves nothing behind", () => {
  it("no timer and no listener on the caller's signal after a success", async () => {
    vi.useFakeTimers();
    const caller = new AbortController();
    const client = createClient({ baseUrl: "http://pay.invalid", fetch: async () => created() });
    const res = await client.post("/payments", { amount_cents: 1 }, { signal: caller.signal });
    expect(res.status).toBe(201);
    expect(vi.getTimerCount()).toBe(0);
    expect(getEventListeners(caller.signal, "abort")).toHaveLength(0);
  });

  it("no timer and no listener after a retry that waited", async () => {
    vi.useFakeTimers();
    const caller = new AbortController();
    let n = 0;
    const client = createClient({
      baseUrl: "http://pay.invalid",
      fetch: async () => (++n === 1 ? unavailable("1") : created()),
    });
    const call = client.post("/payments", { amount_cents: 1 }, { signal: caller.signal });
    await vi.advanceTimersByTimeAsync(1_000);
    expect((await call).status).toBe(201);
    expect(n).toBe(2);
    expect(vi.getTimerCount()).toBe(0);
    expect(getEventListeners(caller.signal, "abort")).toHaveLength(0);
  });
});

describe("the caller's signal", () => {
  it("already aborted: nothing is sent and the call fails with the caller's reason", async () => {
    const seen: Array<AbortSignal | null | undefined> = [];
    const client = createClient({ baseUrl: "http://pay.invalid", fetch: hangingFetch(seen) });
    const reason = new Error("user left the page");
    const err = await client
      .post("/payments", {}, { signal: AbortSignal.abort(reason) })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CallAbortedError);
    expect((err as CallAbortedError).attempts).toBe(0);
    expect((err as CallAbortedError).cause).toBe(reason);
    expect(seen).toHaveLength(0);
  });

  it("aborted during an attempt: the request is cancelled and the call fails at once", async () => {
    const seen: Array<AbortSignal | null | undefined> = [];
    const caller = new AbortController();
    const client = createClient({ baseUrl: "http://pay.invalid", fetch: hangingFetch(seen) });
    const call = client.post("/payments", {}, { signal: caller.signal }).catch((e: unknown) => e);
    await vi.waitFor(() => expect(seen).toHaveLength(1));
    caller.abort(new Error("cancelled"));
    const err = await call;
    expect(err).toBeInstanceOf(CallAbortedError);
    expect((err as CallAbortedError).attempts).toBe(1);
    expect(seen[0]?.aborted).toBe(true);
    expect(seen[0]?.reason).toEqual(new Error("cancelled"));
  });

  it("aborted with no deadline and no per-try timeout still cancels the request", async () => {
    const seen: Array<AbortSignal | null | undefined> = [];
    const caller = new AbortController();
    const client = createClient({
      baseUrl: "http://pay.invalid",
      fetch: hangingFetch(seen),
      deadlineMs: Infinity,
      perTryTimeoutMs: Infinity,
    });
    const call = client.post("/payments", {}, { signal: caller.signal }).catch((e: unknown) => e);
    await vi.waitFor(() => expect(seen).toHaveLength(1));
    caller.abort();
    expect(await call).toBeInstanceOf(CallAbortedError);
    expect(seen[0]?.aborted).toBe(true);
  });

  it("aborted during the wait before a retry: the wait ends at once and nothing more is sent", async () => {
    vi.useFakeTimers();
    const caller = new AbortController();
    let n = 0;
    const client = createClient({
      baseUrl: "http://pay.invalid",
      fetch: async () => {
        n++;
        return unavailable("20");
      },
      deadlineMs: 60_000,
    });
    const call = client.post("/payments", {}, { signal: caller.signal }).catch((e: unknown) => e);
    await vi.advanceTimersByTimeAsync(5_000);
    caller.abort(new Error("stop"));
    await vi.advanceTimersByTimeAsync(0);
    const err = await call;
    expect(err).toBeInstanceOf(CallAbortedError);
    expect((err as CallAbortedError).cause).toEqual(new Error("stop"));
    expect(n).toBe(1);
    expect(vi.getTimerCount()).toBe(0);
  });

  it("aborted just as the wait starts (from the wait hook): the call ends without waiting", async () => {
    vi.useFakeTimers();
    const caller = new AbortController();
    let n = 0;
    const client = createClient({
      baseUrl: "http://pay.invalid",
      fetch: async () => {
        n++;
        return unavailable("20");
      },
      deadlineMs: 60_000,
      on: { wait: () => caller.abort(new Error("gone")) },
    });
    const call = client.post("/payments", {}, { signal: caller.signal }).catch((e: unknown) => e);
    await vi.advanceTimersByTimeAsync(0);
    const settled = await Promise.race([call, Promise.resolve("still waiting")]);
    expect(settled).toBeInstanceOf(CallAbortedError);
    expect(n).toBe(1);
  });
});

describe("the deadline and the per-try timeout", () => {
  it("a deadline of 0 sends nothing and fails as elapsed", async () => {
    const seen: Array<AbortSignal | null | undefined> = [];
    const client = createClient({ baseUrl: "http://pay.invalid", fetch: hangingFetch(seen), deadlineMs: 0 });
    const err = await client.post("/payments", {}).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DeadlineExceededError);
    expect((err as DeadlineExceededError).reason).toBe("elapsed");
    expect(seen).toHaveLength(0);
  });

  it("an attempt cut by the deadline is aborted with a TimeoutError naming the deadline", async () => {
    vi.useFakeTimers();
    const seen: Array<AbortSignal | null | undefined> = [];
    const client = createClient({
      baseUrl: "http://pay.invalid",
      fetch: hangingFetch(seen),
      deadlineMs: 1_000,
      perTryTimeoutMs: 1_000, // equal to the deadline: the deadline is what cuts
    });
    const call = client.post("/payments", {}).catch((e: unknown) => e);
    await vi.advanceTimersByTimeAsync(1_000);
    const err = await call;
    expect(err).toBeInstanceOf(DeadlineExceededError);
    expect((err as DeadlineExceededError).reason).toBe("elapsed");
    expect((err as DeadlineExceededError).attempts).toBe(1);
    const reason = seen[0]?.reason as DOMException;
    expect(reason.name).toBe("TimeoutError");
    expect(reason.message).toBe("Deadline of 1000 ms passed");
  });

  it("an attempt cut by the per-try timeout is aborted with a TimeoutError, and retried", async () => {
    vi.useFakeTimers();
    const seen: Array<AbortSignal | null | undefined> = [];
    const hang = hangingFetch(seen);
    const client = createClient({
      baseUrl: "http://pay.invalid",
      fetch: (url, init) => (seen.length === 0 ? hang(url, init) : Promise.resolve(created())),
      deadlineMs: 10_000,
      perTryTimeoutMs: 300,
      retry: { random: () => 0 },
    });
    const call = client.post("/payments", {});
    await vi.advanceTimersByTimeAsync(300);
    expect(seen[0]?.aborted).toBe(true);
    await vi.advanceTimersByTimeAsync(1_000);
    expect((await call).status).toBe(201);
    const reason = seen[0]?.reason as DOMException;
    expect(reason.name).toBe("TimeoutError");
    expect(reason.message).toBe("Attempt timed out after 300 ms");
  });

  it("a retryable answer that arrives after the deadline ends the call as elapsed, not as a wait too long", async () => {
    vi.useFakeTimers({ toFake: ["Date"] });
    const client = createClient({
      baseUrl: "http://pay.invalid",
      deadlineMs: 5_000,
      fetch: async () => {
        vi.setSystemTime(Date.now() + 6_000); // the answer took longer than the deadline
        return unavailable("1");
      },
    });
    const err = await client.post("/payments", {}).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DeadlineExceededError);
    expect((err as DeadlineExceededError).reason).toBe("elapsed");
    expect((err as DeadlineExceededError).lastResponse?.status).toBe(503);
  });

  it("with no deadline, no per-try timeout and no signal, fetch gets no signal at all", async () => {
    const seen: Array<AbortSignal | null | undefined> = [];
    const client = createClient({
      baseUrl: "http://pay.invalid",
      deadlineMs: Infinity,
      perTryTimeoutMs: Infinity,
      fetch: async (_url, init) => {
        seen.push(init.signal);
        return created();
      },
    });
    expect((await client.post("/payments", {})).status).toBe(201);
    expect(seen).toEqual([null]);
  });
});
