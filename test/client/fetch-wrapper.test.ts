/**
 * `withIdempotency(fetch)`: a fetch-shaped function with keys and retries, against a real server.
 */
import { afterEach, describe, expect, it } from "vitest";
import {
  isDeadlineExceededError,
  isOperationUncertainError,
  withIdempotency,
} from "../../src/client/index.ts";
import { type PaymentServer, startPaymentServer } from "./helpers.ts";

let server: PaymentServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

describe("withIdempotency(fetch)", () => {
  it("returns a business 409 like fetch, but throws for an uncertain operation (its ref must reach a person)", async () => {
    server = await startPaymentServer([
      { status: 409, problem: { type: "urn:example:order-not-shippable" } },
      {
        status: 409,
        problem: {
          type: "urn:idem:problem:operation-uncertain",
          operation_state: "uncertain",
          operation_ref: "op_3",
        },
      },
    ]);
    const idemFetch = withIdempotency(fetch);
    const business = await idemFetch(`${server.url}/orders/1/ship`, { method: "POST", body: "{}" });
    expect(business.status).toBe(409);
    const err = await idemFetch(`${server.url}/payments`, { method: "POST", body: "{}" }).catch((e) => e);
    expect(isOperationUncertainError(err) && err.operationRef).toBe("op_3");
    expect(server.seen).toHaveLength(2);
  });

  it("gives each POST its own key, the same on every retry", async () => {
    server = await startPaymentServer([{ status: 503 }, "charge-and-drop"]);
    const idemFetch = withIdempotency(fetch, { retry: { baseMs: 5 } });
    const res = await idemFetch(`${server.url}/payments`, { method: "POST", body: '{"a":1}' });
    expect(res.status).toBe(201);
    expect(server.seen).toHaveLength(3);
    expect(new Set(server.seen.map((r) => r.key)).size).toBe(1);
    expect(server.totalCharges()).toBe(1);

    await idemFetch(`${server.url}/payments`, { method: "POST", body: '{"a":1}' });
    expect(server.seen[3]?.key).not.toBe(server.seen[0]?.key); // a new call is a new intent
  });

  it("keeps a key the caller set, and accepts a Request", async () => {
    server = await startPaymentServer([{ status: 502 }]);
    const idemFetch = withIdempotency(undefined, { retry: { baseMs: 5 } });
    const req = new Request(`${server.url}/payments`, {
      method: "POST",
      headers: { "Idempotency-Key": "order-9-key", "content-type": "application/json" },
      body: '{"b":2}',
    });
    const res = await idemFetch(req);
    expect(res.status).toBe(201);
    expect(server.seen.map((r) => [r.key, r.body])).toEqual([
      ["order-9-key", '{"b":2}'],
      ["order-9-key", '{"b":2}'],
    ]);
    expect(await idemFetch.client.store.list()).toEqual([]); // unnamed intents are forgotten once done
  });

  it("retries a GET without adding a key", async () => {
    server = await startPaymentServer([{ status: 503 }]);
    const idemFetch = withIdempotency(fetch, { retry: { baseMs: 5 } });
    const res = await idemFetch(`${server.url}/payments/1`);
    expect(res.status).toBe(201);
    expect(server.seen.map((r) => [r.method, r.key])).toEqual([
      ["GET", undefined],
      ["GET", undefined],
    ]);
  });

  it("like fetch, returns the last response when it gives up after one", async () => {
    server = await startPaymentServer([{ status: 503, headers: { "retry-after": "60" } }]);
    const idemFetch = withIdempotency(fetch);
    const res = await idemFetch(`${server.url}/payments`, { method: "POST", body: "{}" });
    expect(res.status).toBe(503);
    expect(await res.json()).toEqual({ error: "scripted 503" });
  });

  it("still throws when no response came back", async () => {
    server = await startPaymentServer(["hang"]);
    const idemFetch = withIdempotency(fetch, { deadlineMs: 200 });
    const err = await idemFetch(`${server.url}/payments`, { method: "POST", body: "{}" }).catch((e) => e);
    expect(isDeadlineExceededError(err)).toBe(true);
  });
});
