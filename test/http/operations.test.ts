/**
 * The lookup handler on its own (src/http/operations.ts), over a reader kept in memory: the bounds of
 * `?wait=`, the claim a reference names, compact keys. Its behaviour over a real store and service is
 * test/app/operations.test.ts.
 */
import { describe, expect, it } from "vitest";
import { encodeOperationRef, type OperationRecord } from "../../src/core/index.ts";
import { operationLookup } from "../../src/http/operations.ts";

const CLAIM = "0190f5b2-7c1e-4a8e-9a51-3c2d1e0f9a7b";
const at = new Date("2026-01-01T00:00:00Z");

function record(over: Partial<OperationRecord> = {}): OperationRecord {
  return {
    claimId: CLAIM,
    state: "in_progress",
    createdAt: at,
    updatedAt: null,
    expiresAt: new Date(at.getTime() + 86_400_000),
    answer: null,
    ...over,
  };
}

function handler(read: () => OperationRecord | undefined, maxWaitSeconds = 0.3) {
  let reads = 0;
  const lookup = operationLookup<undefined>({
    read: async () => {
      reads++;
      return read();
    },
    scope: (req) => req.headers.get("x-account") ?? undefined,
    maxWaitSeconds,
  });
  const get = (path: string, account = "acct") =>
    lookup(new Request(`http://x/v1/operations${path}`, { headers: { "x-account": account } }), undefined);
  return { get, reads: () => reads };
}

describe("operationLookup", () => {
  it("cuts ?wait= to maxWaitSeconds, reading again meanwhile, and answers the state as it is", async () => {
    const h = handler(() => record());
    const t = performance.now();
    const res = await h.get(`/${encodeOperationRef("acct", "k", CLAIM)}?wait=30`);
    const ms = performance.now() - t;
    expect(res.status).toBe(200);
    expect(res.headers.get("cache-control")).toBe("no-store");
    expect(await res.json()).toMatchObject({ operation_state: "in_progress", updated_at: null });
    expect(ms).toBeGreaterThanOrEqual(290);
    expect(ms).toBeLessThan(2_000);
    expect(h.reads()).toBeGreaterThan(2); // polled: 50, 100, 200 ms...
  });

  it("refuses a wait that is not a number of seconds", async () => {
    const res = await handler(() => record()).get(`/${encodeOperationRef("acct", "k")}?wait=soon`);
    expect(res.status).toBe(400);
  });

  it("a reference of another claim of the key (claimed again since) is 404; one without a claim finds the live one", async () => {
    const h = handler(() => record({ claimId: "1190f5b2-7c1e-4a8e-9a51-3c2d1e0f9a7b" }));
    expect((await h.get(`/${encodeOperationRef("acct", "k", CLAIM)}`)).status).toBe(404);
    const live = await h.get(`/${encodeOperationRef("acct", "k")}`);
    expect(live.status).toBe(200);
    expect(live.headers.get("idempotency-operation-ref")).toBe(
      encodeOperationRef("acct", "k", "1190f5b2-7c1e-4a8e-9a51-3c2d1e0f9a7b"),
    );
  });

  it("a saved 4xx is failed_not_applied; a compact key without rebuild says its status", async () => {
    const body = new TextEncoder().encode('{"type":"urn:x:card-declined"}');
    const declined = record({
      state: "done",
      answer: {
        kind: "reply",
        response: { status: 402, headers: [["content-type", "application/problem+json"]], body },
      },
    });
    const res = await handler(() => declined).get(`/${encodeOperationRef("acct", "k")}`);
    expect(res.status).toBe(402);
    expect(res.headers.get("idempotency-operation-state")).toBe("failed_not_applied");
    expect(new Uint8Array(await res.arrayBuffer())).toEqual(body);
    const compact = record({
      state: "done",
      answer: { kind: "compact", saved: { status: 201, id: "pay_1" } },
    });
    const doc = await (await handler(() => compact).get(`/${encodeOperationRef("acct", "k")}`)).json();
    expect(doc).toMatchObject({ operation_state: "done", status: 201 });
  });

  it("without authentication: 401, nothing read", async () => {
    let reads = 0;
    const lookup = operationLookup({
      read: async () => {
        reads++;
        return record();
      },
      scope: () => undefined,
    });
    expect((await lookup(new Request("http://x/v1/operations/op_x"), undefined)).status).toBe(401);
    expect(reads).toBe(0);
  });
});
