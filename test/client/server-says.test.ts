/**
 * The client does what each answer says it may safely do next (issue 18): it retries only when the
 * server says the same key can help, stops on an uncertain operation and hands its reference to a
 * person, and starts a fresh key only when asked and only when the server said that is safe.
 * Real HTTP on 127.0.0.1; the server speaks idem's contract (problem+json fields and headers).
 */
import { afterEach, describe, expect, it } from "vitest";
import {
  type AttemptEvent,
  createClient,
  type GiveUpEvent,
  isAttemptsExhaustedError,
  isGiveUpError,
  isNewKeyNotSafeError,
  isOperationUncertainError,
  OperationState,
} from "../../src/client/index.ts";
import { type PaymentServer, type Step, startPaymentServer } from "./helpers.ts";

let server: PaymentServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

const P = "urn:idem:problem:";
const inFlight: Step = {
  status: 409,
  headers: { "retry-after": "0" },
  problem: {
    type: `${P}idempotency-key-in-flight`,
    operation_state: "in_progress",
    retry_same_key: true,
    safe_new_key: false,
    operation_ref: "op_1",
  },
};
const uncertain: Step = {
  status: 409,
  headers: { "idempotency-operation-state": "uncertain" },
  problem: {
    type: `${P}operation-uncertain`,
    operation_state: "uncertain",
    retry_same_key: false,
    safe_new_key: false,
    operation_ref: "op_42",
  },
};
const unavailableNothingClaimed: Step = {
  status: 503,
  headers: { "retry-after": "0" },
  problem: {
    type: `${P}retryable-failure`,
    operation_state: "none",
    retry_same_key: true,
    safe_new_key: true,
  },
};
const mismatch: Step = {
  status: 422,
  problem: {
    type: `${P}idempotency-key-mismatch`,
    operation_state: "none",
    retry_same_key: false,
    safe_new_key: true,
  },
};

describe("what the server says decides what the client does", () => {
  it("in flight (body fields): retried with the same key; the hooks carry the state", async () => {
    server = await startPaymentServer([inFlight]);
    const attempts: AttemptEvent[] = [];
    const client = createClient({ baseUrl: server.url, on: { attempt: (e) => attempts.push(e) } });
    const res = await client.post("/payments", { amount_cents: 1 });
    expect(res.status).toBe(201);
    expect(server.seen.map((r) => r.key)).toEqual([server.seen[0]!.key, server.seen[0]!.key]);
    expect(attempts.map((a) => [a.status, a.operationState, a.retryable])).toEqual([
      [409, "in_progress", true],
      [201, undefined, false],
    ]);
  });

  it("in flight said by the header alone (no problem body) is retried too", async () => {
    server = await startPaymentServer([
      { status: 409, headers: { "idempotency-operation-state": "in_progress" } },
    ]);
    const client = createClient({ baseUrl: server.url, retry: { baseMs: 1 } });
    expect((await client.post("/payments", {})).status).toBe(201);
    expect(server.seen).toHaveLength(2);
  });

  it("retry_same_key: false wins over the status: a 503 the server calls final is returned at once", async () => {
    server = await startPaymentServer([
      {
        status: 503,
        problem: { type: "urn:example:maintenance", operation_state: "none", retry_same_key: false },
      },
    ]);
    const client = createClient({ baseUrl: server.url });
    const res = await client.post("/payments", {});
    expect(res.status).toBe(503);
    expect(server.seen).toHaveLength(1);
  });

  it("uncertain: never retried, a typed error carries the operation_ref, the intent leaves pending()", async () => {
    server = await startPaymentServer([uncertain]);
    const giveUps: GiveUpEvent[] = [];
    const client = createClient({ baseUrl: server.url, on: { giveUp: (e) => giveUps.push(e) } });
    const err = await client.post("/payments", { amount_cents: 5 }, { intent: "order-9" }).catch((e) => e);

    expect(isOperationUncertainError(err)).toBe(true);
    expect(isGiveUpError(err)).toBe(false); // resending later is not the fix
    expect(err).toMatchObject({ operationRef: "op_42", intentId: "order-9", attempts: 1 });
    expect(await err.lastResponse.json()).toMatchObject({ operation_ref: "op_42" });
    expect(server.seen).toHaveLength(1);
    expect(giveUps.map((e) => [e.error.code, e.error.operationState])).toEqual([
      ["IDEM_OPERATION_UNCERTAIN", OperationState.uncertain],
    ]);
    expect(await client.store.get("order-9")).toMatchObject({
      status: "uncertain",
      lastAnswer: { status: 409, operationState: "uncertain", operationRef: "op_42" },
    });
    expect(await client.pending()).toEqual([]);

    // Neither resume() nor a repeat of the request sends it again; nor does a new key.
    await expect(client.resume("order-9")).rejects.toMatchObject({
      code: "IDEM_OPERATION_UNCERTAIN",
      operationRef: "op_42",
    });
    await expect(client.post("/payments", { amount_cents: 5 }, { intent: "order-9" })).rejects.toMatchObject({
      code: "IDEM_OPERATION_UNCERTAIN",
    });
    await expect(client.retryWithNewKey("order-9")).rejects.toMatchObject({ code: "IDEM_NEW_KEY_NOT_SAFE" });
    expect(server.seen).toHaveLength(1);
  });

  it("uncertain is not retried even by a retry predicate that says yes to everything", async () => {
    server = await startPaymentServer([uncertain]);
    const client = createClient({ baseUrl: server.url, retry: { shouldRetry: () => true } });
    await expect(client.post("/payments", {})).rejects.toMatchObject({ code: "IDEM_OPERATION_UNCERTAIN" });
    expect(server.seen).toHaveLength(1);
  });

  it("a give-up carries the state; retryWithNewKey sends the same request under a new key when safe", async () => {
    server = await startPaymentServer([unavailableNothingClaimed, unavailableNothingClaimed]);
    const client = createClient({ baseUrl: server.url, maxAttempts: 2 });
    const err = await client.post("/payments", { amount_cents: 7 }, { intent: "order-10" }).catch((e) => e);
    expect(isAttemptsExhaustedError(err)).toBe(true);
    expect(err).toMatchObject({ operationState: "none", safeNewKey: true, attempts: 2 });
    const before = await client.store.get("order-10");
    expect(before).toMatchObject({
      status: "pending",
      attempts: 2,
      lastAnswer: { status: 503, safeNewKey: true },
    });

    const res = await client.retryWithNewKey("order-10");
    expect(res.status).toBe(201);
    const keys = server.seen.map((r) => r.key);
    expect(keys[0]).toBe(keys[1]);
    expect(keys[2]).not.toBe(keys[0]);
    expect(server.seen.every((r) => r.body === '{"amount_cents":7}')).toBe(true);
    expect(await client.store.get("order-10")).toMatchObject({ status: "done", attempts: 1, key: keys[2] });
  });

  it("a final answer with safe_new_key (422 key reused) is returned; a new key is used only on request", async () => {
    server = await startPaymentServer([mismatch]);
    const client = createClient({ baseUrl: server.url });
    const res = await client.post("/payments", { amount_cents: 8 }, { intent: "order-11" });
    expect(res.status).toBe(422);
    expect(server.seen).toHaveLength(1);
    expect(await client.store.get("order-11")).toMatchObject({
      status: "done",
      lastAnswer: { status: 422, operationState: "none", safeNewKey: true },
    });
    expect((await client.retryWithNewKey("order-11")).status).toBe(201);
    expect(server.seen[1]!.key).not.toBe(server.seen[0]!.key);
  });

  it("retryWithNewKey refuses when the server never said a new key is safe, and sends nothing", async () => {
    server = await startPaymentServer([{ status: 503 }, { status: 503 }]);
    const client = createClient({ baseUrl: server.url, maxAttempts: 2, retry: { baseMs: 1 } });
    await client.post("/payments", {}, { intent: "order-12" }).catch(() => {});
    const err = await client.retryWithNewKey("order-12").catch((e) => e);
    expect(isNewKeyNotSafeError(err)).toBe(true);
    expect(server.seen).toHaveLength(2);
  });

  it("the retry predicate is configurable", async () => {
    server = await startPaymentServer([{ status: 409, problem: { type: "urn:example:order-locked" } }]);
    const client = createClient({
      baseUrl: server.url,
      retry: { baseMs: 1, shouldRetry: (a) => a.type === "urn:example:order-locked" },
    });
    expect((await client.post("/payments", {})).status).toBe(201);
    expect(server.seen).toHaveLength(2);
  });
});
