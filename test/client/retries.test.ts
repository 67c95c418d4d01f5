/**
 * The retry loop against a real HTTP server on loopback that fails on purpose.
 */
import { afterEach, describe, expect, it } from "vitest";
import {
  type AttemptEvent,
  createClient,
  DeadlineReason,
  isAttemptsExhaustedError,
  isCallAbortedError,
  isDeadlineExceededError,
  type WaitEvent,
} from "../../src/client/index.ts";
import { type PaymentServer, startPaymentServer } from "./helpers.ts";

let server: PaymentServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

async function rejection(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  throw new Error("expected the call to fail");
}

describe("a payment through a server that fails on purpose", () => {
  it("503, then 429 Retry-After: 1, then a dropped reply, then a replay: four attempts, one charge, one key", async () => {
    server = await startPaymentServer([
      { status: 503 },
      { status: 429, headers: { "retry-after": "1" } },
      "charge-and-drop",
    ]);
    const attempts: AttemptEvent[] = [];
    const waits: WaitEvent[] = [];
    const client = createClient({
      baseUrl: server.url,
      on: { attempt: (e) => attempts.push(e), wait: (e) => waits.push(e) },
    });
    const intent = await client.intent("checkout-42");
    const started = Date.now();
    const res = await client.post("/payments", { amount_cents: 5000, currency: "eur" }, { intent });

    expect(res.status).toBe(201);
    expect(res.headers.get("idempotent-replayed")).toBe("true");
    expect(await res.json()).toEqual({ charge_id: 1 });
    expect(server.seen).toHaveLength(4);
    expect(server.totalCharges()).toBe(1);
    expect(new Set(server.seen.map((r) => r.key))).toEqual(new Set([intent.key]));
    expect(server.seen.every((r) => r.body === '{"amount_cents":5000,"currency":"eur"}')).toBe(true);

    // What the hooks saw, the key on every event.
    expect(attempts.map((a) => a.status ?? "error")).toEqual([503, 429, "error", 201]);
    expect(((attempts[2]!.error as Error).cause as { code?: string }).code).toBe("UND_ERR_SOCKET");
    expect(waits.map((w) => w.source)).toEqual(["backoff", "retry-after", "backoff"]);
    expect(waits[1]?.delayMs).toBe(1000);
    expect([...attempts, ...waits].every((e) => e.key === intent.key && e.intentId === "checkout-42")).toBe(
      true,
    );
    expect(Date.now() - started).toBeGreaterThanOrEqual(1000);
    const stored = await client.store.get("checkout-42");
    expect(stored).toMatchObject({ status: "done", attempts: 4, outcome: { status: 201 } });
  });

  it("retries a 409 only when the server says the key is in flight, then returns the 201", async () => {
    server = await startPaymentServer([
      {
        status: 409,
        headers: { "retry-after": "0" },
        problem: {
          type: "urn:idem:problem:idempotency-key-in-flight",
          operation_state: "in_progress",
          retry_same_key: true,
          safe_new_key: false,
        },
      },
    ]);
    const client = createClient({ baseUrl: server.url });
    const res = await client.post("/payments", { amount_cents: 100 });
    expect(res.status).toBe(201);
    expect(server.seen).toHaveLength(2);
    expect(server.seen[0]?.key).toBe(server.seen[1]?.key);
  });

  it("returns a business 409 at once, body intact, without retrying", async () => {
    server = await startPaymentServer([
      { status: 409, problem: { type: "urn:example:topup-id-taken", detail: "topup id already used" } },
    ]);
    const client = createClient({ baseUrl: server.url });
    const res = await client.post("/payments", { amount_cents: 100 }, { intent: "topup-1" });
    expect(res.status).toBe(409);
    expect(await res.json()).toMatchObject({ type: "urn:example:topup-id-taken" });
    expect(server.seen).toHaveLength(1);
    expect(await client.store.get("topup-1")).toMatchObject({ status: "done", outcome: { status: 409 } });
  });

  it("gives up at once on 429 Retry-After: 60 against a 10 s deadline", async () => {
    server = await startPaymentServer([{ status: 429, headers: { "retry-after": "60" } }]);
    const client = createClient({ baseUrl: server.url, deadlineMs: 10_000 });
    const started = Date.now();
    const err = await rejection(client.post("/payments", { amount_cents: 100 }));
    const elapsed = Date.now() - started;

    expect(isDeadlineExceededError(err)).toBe(true);
    if (!isDeadlineExceededError(err)) return;
    expect(err.reason).toBe(DeadlineReason.waitTooLong);
    expect(err.waitMs).toBe(60_000);
    expect(err.attempts).toBe(1);
    expect(err.lastResponse?.status).toBe(429);
    expect(await err.lastResponse?.json()).toEqual({ error: "scripted 429" });
    expect(elapsed).toBeLessThan(500);
    expect(server.seen).toHaveLength(1);
    // Outcome unknown as far as the client knows: the intent stays pending with its key.
    expect((await client.pending()).map((i) => i.key)).toEqual([err.key]);
  });

  it("an abort during a wait rejects at once", async () => {
    server = await startPaymentServer([{ status: 503, headers: { "retry-after": "5" } }]);
    const controller = new AbortController();
    let abortedAt = 0;
    const client = createClient({
      baseUrl: server.url,
      // Abort 50 ms into the 5 s wait.
      on: {
        wait: () =>
          setTimeout(() => {
            abortedAt = Date.now();
            controller.abort(new Error("user closed the page"));
          }, 50),
      },
    });
    const err = await rejection(
      client.post("/payments", { amount_cents: 100 }, { signal: controller.signal }),
    );
    expect(abortedAt).toBeGreaterThan(0);
    expect(Date.now() - abortedAt).toBeLessThan(50);
    expect(isCallAbortedError(err)).toBe(true);
    expect((err as Error).cause).toEqual(new Error("user closed the page"));
    expect(server.seen).toHaveLength(1);
  });

  it("the deadline cuts a hanging attempt short", async () => {
    server = await startPaymentServer(["hang"]);
    const client = createClient({ baseUrl: server.url, deadlineMs: 300, perTryTimeoutMs: 10_000 });
    const started = Date.now();
    const err = await rejection(client.post("/payments", { amount_cents: 100 }));
    expect(isDeadlineExceededError(err) && err.reason === DeadlineReason.elapsed).toBe(true);
    expect(Date.now() - started).toBeGreaterThanOrEqual(290);
    expect(Date.now() - started).toBeLessThan(800);
  });

  it("a per-try timeout is an unknown outcome: retried with the same key, charged once", async () => {
    server = await startPaymentServer(["hang"]);
    const client = createClient({ baseUrl: server.url, perTryTimeoutMs: 200, retry: { baseMs: 10 } });
    const res = await client.post("/payments", { amount_cents: 100 });
    expect(res.status).toBe(201);
    expect(server.seen).toHaveLength(2);
    expect(server.seen[0]?.key).toBe(server.seen[1]?.key);
    expect(server.totalCharges()).toBe(1);
  });

  it("a final answer (402, 422...) returns at once with its body", async () => {
    server = await startPaymentServer([{ status: 402 }]);
    const client = createClient({ baseUrl: server.url });
    const res = await client.post("/payments", { amount_cents: 100 }, { intent: "order-402" });
    expect(res.status).toBe(402);
    expect(await res.json()).toEqual({ error: "scripted 402" });
    expect(server.seen).toHaveLength(1);
    expect(await client.store.get("order-402")).toMatchObject({ status: "done", outcome: { status: 402 } });
  });

  it("keeps named intents once done, and forgets unnamed ones (the store does not grow per call)", async () => {
    server = await startPaymentServer();
    const client = createClient({ baseUrl: server.url });
    for (let i = 0; i < 20; i++) await client.post("/payments", { i });
    expect(await client.store.list()).toEqual([]);
    const named = await client.intent("order-1");
    await client.post("/payments", { i: 1 }, { intent: named });
    expect((await client.store.list()).map((r) => [r.id, r.status])).toEqual([["order-1", "done"]]);
    expect((await client.intent("order-1")).key).toBe(named.key);
  });

  it("gives up after maxAttempts with the last response, its body readable", async () => {
    server = await startPaymentServer([{ status: 503 }, { status: 502 }, { status: 500 }]);
    const client = createClient({ baseUrl: server.url, maxAttempts: 3, retry: { baseMs: 5 } });
    const err = await rejection(client.post("/payments", { amount_cents: 100 }));
    expect(isAttemptsExhaustedError(err)).toBe(true);
    if (!isAttemptsExhaustedError(err)) return;
    expect(err.attempts).toBe(3);
    expect(err.lastResponse?.status).toBe(500);
    expect(await err.lastResponse?.text()).toBe('{"error":"scripted 500"}');
    expect(server.seen).toHaveLength(3);
  });

  it("retries only the statuses it is told to", async () => {
    server = await startPaymentServer([{ status: 502 }]);
    const client = createClient({ baseUrl: server.url, retry: { statuses: [503] } });
    const res = await client.post("/payments", {});
    expect(res.status).toBe(502);
    expect(server.seen).toHaveLength(1);
  });

  it("refuses to send one intent's key with a different request", async () => {
    server = await startPaymentServer();
    const client = createClient({ baseUrl: server.url });
    const intent = await client.intent("order-7");
    await client.post("/payments", { amount_cents: 100 }, { intent });
    await expect(client.post("/payments", { amount_cents: 999 }, { intent })).rejects.toMatchObject({
      code: "IDEM_INTENT_CONFLICT",
    });
    // The same request again is fine: the server replays.
    const again = await client.post("/payments", { amount_cents: 100 }, { intent });
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(server.totalCharges()).toBe(1);
  });

  it("sends credentials from the client's headers on every attempt without storing them", async () => {
    server = await startPaymentServer([{ status: 503 }]);
    const client = createClient({
      baseUrl: server.url,
      headers: () => ({ authorization: "Bearer secret" }),
      retry: { baseMs: 5 },
    });
    await client.request("order-8", "/payments", {
      method: "POST",
      body: "{}",
      headers: { "content-type": "application/json", cookie: "session=1" },
    });
    const stored = await client.store.get("order-8");
    expect(stored?.request?.headers).toEqual([["content-type", "application/json"]]);
    expect(JSON.stringify(stored)).not.toContain("secret");
  });

  it("quotes the key as an sf-string when asked", async () => {
    server = await startPaymentServer();
    let rawKey = "";
    const client = createClient({
      baseUrl: server.url,
      keyFormat: "sf-string",
      fetch: (url, init) => {
        rawKey = new Headers(init.headers).get("idempotency-key") ?? "";
        return fetch(url, init);
      },
    });
    const intent = await client.intent();
    await client.post("/payments", {}, { intent });
    expect(rawKey).toBe(`"${intent.key}"`);
    expect(server.seen[0]?.key).toBe(intent.key);
  });
});
