/**
 * Issue 14's client side: the intent remembers when the server forgets its key (and refuses to send
 * it after that), counts each attempt in the store before sending it, and times attempts by the
 * timing contract (10 s per try, 30 s per call, later tries raised to the server's answer bound).
 */
import { afterEach, describe, expect, it, vi } from "vitest";
import { createClient, isIntentExpiredError } from "../../src/client/index.ts";
import { type PaymentServer, scriptedFetch, startPaymentServer } from "./helpers.ts";

let server: PaymentServer | undefined;
afterEach(async () => {
  vi.useRealTimers();
  await server?.close();
  server = undefined;
});

const HOUR = 3_600_000;

describe("the key's expiry on the server", () => {
  it("is recorded from Idempotency-Expires; resume() after it throws IntentExpiredError and sends nothing", async () => {
    const expires = new Date(Date.now() + HOUR);
    const headers = { "idempotency-expires": expires.toUTCString() };
    server = await startPaymentServer([
      { status: 503, headers },
      { status: 503, headers },
    ]);
    const client = createClient({ baseUrl: server.url, maxAttempts: 2, retry: { baseMs: 1 } });
    await client.post("/payments", { amount_cents: 1 }, { intent: "order-1" }).catch(() => {});
    const stored = await client.store.get("order-1");
    expect(stored).toMatchObject({
      status: "pending",
      expiresAt: new Date(expires.toUTCString()).toISOString(),
    });

    vi.useFakeTimers({ toFake: ["Date"] });
    vi.setSystemTime(Date.now() + 2 * HOUR);
    const err = await client.resume("order-1").catch((e) => e);
    expect(isIntentExpiredError(err)).toBe(true);
    expect(err.expiresAt).toBe(stored?.expiresAt);
    // Sending the same request again under the intent is refused the same way.
    await expect(client.post("/payments", { amount_cents: 1 }, { intent: "order-1" })).rejects.toMatchObject({
      code: "IDEM_INTENT_EXPIRED",
    });
    expect(server.seen).toHaveLength(2);
    expect((await client.store.get("order-1"))?.attempts).toBe(2);
  });

  it("without the header, keyRetentionMs after the intent began stands in (Infinity turns it off)", async () => {
    server = await startPaymentServer([{ status: 503 }, "ok"]);
    const client = createClient({ baseUrl: server.url, keyRetentionMs: HOUR, maxAttempts: 1 });
    await client.post("/payments", {}, { intent: "order-2" }).catch(() => {});
    vi.useFakeTimers({ toFake: ["Date"] });
    vi.setSystemTime(Date.now() + 2 * HOUR);
    await expect(client.resume("order-2")).rejects.toMatchObject({ code: "IDEM_INTENT_EXPIRED" });
    expect(server.seen).toHaveLength(1);

    const lenient = createClient({ baseUrl: server.url, store: client.store, keyRetentionMs: Infinity });
    expect((await lenient.resume("order-2")).status).toBe(201);
  });
});

describe("attempts are counted before they are sent", () => {
  it("when the server sees attempt n, the stored intent already says n", async () => {
    server = await startPaymentServer([{ status: 503 }, { status: 502 }]);
    const client = createClient({ baseUrl: server.url, retry: { baseMs: 1 } });
    const seenByServer: Promise<number | undefined>[] = [];
    // The memory store's get() copies the record synchronously: what is stored when the request lands.
    server.onRequest = () => seenByServer.push(client.store.get("order-3").then((r) => r?.attempts));
    await client.post("/payments", {}, { intent: "order-3" });
    expect(await Promise.all(seenByServer)).toEqual([1, 2, 3]);
    expect((await client.store.get("order-3"))?.attempts).toBe(3);
  });
});

/** A fetch that never answers; it rejects with the signal's reason when aborted, and notes when. */
function hangingFetch(first?: () => Response) {
  const abortedAt: number[] = [];
  const started = Date.now();
  const s = scriptedFetch((n, init) => {
    if (n === 1 && first) return first();
    return new Promise<Response>((_resolve, reject) => {
      init.signal?.addEventListener("abort", () => {
        abortedAt.push(Date.now() - started);
        reject(init.signal?.reason);
      });
    });
  });
  return { ...s, abortedAt };
}

describe("timing defaults follow the server's answer bound", () => {
  it("by default one try gets 10 s and the whole call 30 s", async () => {
    vi.useFakeTimers();
    const f = hangingFetch();
    const client = createClient({ fetch: f.fetch, retry: { random: () => 0 } });
    const call = client.post("http://api.test/payments", {}).catch((e) => e);
    await vi.advanceTimersByTimeAsync(9_999);
    expect(f.abortedAt).toEqual([]);
    await vi.advanceTimersByTimeAsync(1);
    expect(f.abortedAt).toEqual([10_000]);
    await vi.advanceTimersByTimeAsync(20_000);
    const err = await call;
    expect(err).toMatchObject({ code: "IDEM_DEADLINE_EXCEEDED", reason: "elapsed" });
    // Tries of 10 s each (a zero backoff still takes a timer tick), the last cut by the deadline.
    expect(f.abortedAt).toHaveLength(3);
    expect(f.abortedAt[0]).toBe(10_000);
    expect(f.abortedAt[1]! - 20_000).toBeLessThanOrEqual(1);
    expect(f.abortedAt[2]).toBe(30_000);
  });

  it("after an answer with Idempotency-Answer-Within: N, later tries get at least N + 2 s", async () => {
    vi.useFakeTimers();
    const f = hangingFetch(
      () =>
        new Response(
          JSON.stringify({ type: "urn:idem:problem:idempotency-key-in-flight", retry_same_key: true }),
          {
            status: 409,
            headers: {
              "content-type": "application/problem+json",
              "retry-after": "0",
              "idempotency-answer-within": "12",
            },
          },
        ),
    );
    const client = createClient({ fetch: f.fetch, perTryTimeoutMs: 3_000, deadlineMs: 20_000 });
    const call = client.post("http://api.test/payments", {}).catch((e) => e);
    await vi.advanceTimersByTimeAsync(13_999);
    expect(f.abortedAt).toEqual([]); // not cut at the configured 3 s
    await vi.advanceTimersByTimeAsync(1);
    expect(f.abortedAt).toEqual([14_000]);
    // The next try is capped by the 20 s deadline.
    await vi.advanceTimersByTimeAsync(6_000);
    expect((await call).code).toBe("IDEM_DEADLINE_EXCEEDED");
    expect(f.abortedAt).toEqual([14_000, 20_000]);
  });
});
