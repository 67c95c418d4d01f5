/**
 * What the lean success path must still do: store the intent before the first attempt, give fetch a
 * signal and the caller's other init fields, fire hooks, turn every error into a rejection; plus the
 * cheap timestamps and breaker permits it uses.
 */
import { describe, expect, it } from "vitest";
import {
  type AttemptEvent,
  CircuitBreaker,
  CircuitState,
  createClient,
  type DoneEvent,
  type IntentRecord,
  MemoryIntentStore,
} from "../../src/client/index.ts";
import { isoNow } from "../../src/client/intent-store.ts";

const ok = () => Promise.resolve(new Response("{}", { status: 201 }));

describe("the success path", () => {
  it("sends nothing before the intent's write has completed, even when the store is slow", async () => {
    const events: string[] = [];
    class SlowStore extends MemoryIntentStore {
      override async create(record: IntentRecord): Promise<IntentRecord> {
        await new Promise((r) => setTimeout(r, 20));
        const stored = await super.create(record);
        events.push(`stored ${record.request?.method} ${record.request?.url}`);
        return stored;
      }
    }
    const client = createClient({
      baseUrl: "http://127.0.0.1:1",
      store: new SlowStore(),
      fetch: () => {
        events.push("fetch");
        return ok();
      },
    });
    await client.post("/payments", { amount_cents: 1 });
    expect(events).toEqual(["stored POST http://127.0.0.1:1/payments", "fetch"]);
  });

  it("gives fetch a signal, the caller's other init fields, and none of the client's own", async () => {
    const inits: RequestInit[] = [];
    const client = createClient({
      baseUrl: "http://127.0.0.1:1",
      fetch: (_url, init) => {
        inits.push(init);
        return ok();
      },
    });
    await client.post(
      "/payments",
      { a: 1 },
      { credentials: "include", deadlineMs: 5_000, intent: "order-1" },
    );
    await client.post("/payments", { a: 2 });
    const [named, unnamed] = inits;
    expect(named?.credentials).toBe("include");
    expect(Object.keys(named ?? {}).sort()).toEqual(["body", "credentials", "headers", "method", "signal"]);
    expect(Object.keys(unnamed ?? {}).sort()).toEqual(["body", "headers", "method", "signal"]);
    for (const init of inits) expect(init.signal).toBeInstanceOf(AbortSignal);
    expect(named?.body).toBe('{"a":1}');
    expect(named?.headers).toMatchObject({ "content-type": "application/json" });
  });

  it("fires the hooks with the intent and its key", async () => {
    const attempts: AttemptEvent[] = [];
    const done: DoneEvent[] = [];
    const client = createClient({
      baseUrl: "http://127.0.0.1:1",
      fetch: ok,
      on: { attempt: (e) => attempts.push(e), done: (e) => done.push(e) },
    });
    const intent = await client.intent("order-2");
    await client.post("/payments", {}, { intent });
    expect(attempts).toEqual([
      expect.objectContaining({
        method: "POST",
        url: "http://127.0.0.1:1/payments",
        intentId: "order-2",
        key: intent.key,
        attempt: 1,
        status: 201,
        retryable: false,
      }),
    ]);
    expect(done).toEqual([expect.objectContaining({ intentId: "order-2", key: intent.key, attempts: 1 })]);
    expect((await client.store.get("order-2"))?.status).toBe("done");
  });

  it("post() rejects rather than throws, whatever goes wrong before sending", async () => {
    const client = createClient({ baseUrl: "http://127.0.0.1:1", fetch: ok });
    const circular: Record<string, unknown> = {};
    circular.self = circular;
    let call: Promise<Response> | undefined;
    expect(() => {
      call = client.post("/payments", circular);
    }).not.toThrow();
    await expect(call).rejects.toThrow(TypeError);
    await expect(client.post("http://[::1", {})).rejects.toThrow(TypeError); // an invalid URL
  });
});

describe("isoNow", () => {
  it("is new Date(ms).toISOString(), across minutes, going back in time and beyond year 9999", () => {
    const samples = [
      0, 1, 59_999, 60_000, 60_001, 1_764_450_000_000, 1_764_450_059_999, 1_764_450_060_000,
      1_764_450_000_000, 951_782_400_000, 253_402_300_799_999, 253_402_300_800_000, -1, -62_198_755_200_000,
    ];
    let t = 1_764_450_000_000;
    for (let i = 0; i < 5_000; i++) {
      t += Math.floor(Math.random() * 5_000) - 1_000; // mostly forwards, sometimes back
      samples.push(t);
    }
    for (let i = 0; i < 1_000; i++) samples.push(Math.floor(Math.random() * 253_402_300_800_000));
    for (const ms of samples) expect(isoNow(ms)).toBe(new Date(ms).toISOString());
  });

  it("reads the clock when given no time", () => {
    const before = new Date().toISOString();
    const now = isoNow();
    expect(now >= before && now <= new Date().toISOString()).toBe(true);
  });
});

describe("breaker permits", () => {
  it("count their first verdict only", () => {
    const breaker = new CircuitBreaker({ consecutiveFailures: 2 });
    const permit = breaker.tryAcquire()!;
    permit.failure();
    permit.failure();
    permit.success();
    expect(breaker.state).toBe(CircuitState.closed);
    breaker.tryAcquire()!.failure();
    expect(breaker.state).toBe(CircuitState.open);
  });
});
