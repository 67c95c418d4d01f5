/**
 * The lookup handler on its own (src/http/operations.ts), over a reader kept in memory: the bounds of
 * `?wait=`, the claim a reference names, compact keys. Its behaviour over a real store and service is
 * test/app/operations.test.ts.
 */
import { randomBytes } from "node:crypto";
import { describe, expect, it } from "vitest";
import { type OperationRecord, OperationRefs } from "../../src/core/index.ts";
import { operationLookup } from "../../src/http/operations.ts";

const refs = new OperationRefs([{ id: "t1", secret: randomBytes(32) }]);
const encodeOperationRef = (scope: string, key: string, claimId?: string) => refs.encode(scope, key, claimId);

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
  const asked: Array<[string, string]> = [];
  const lookup = operationLookup<undefined>({
    read: async (scope, key) => {
      reads++;
      asked.push([scope, key]);
      return read();
    },
    refs,
    scope: (req) => req.headers.get("x-account") ?? undefined,
    maxWaitSeconds,
  });
  const get = (path: string, account = "acct") =>
    lookup(new Request(`http://x/v1/operations${path}`, { headers: { "x-account": account } }), undefined);
  return { get, reads: () => reads, asked };
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

  it("a malformed, forged, altered, foreign or unknown reference: the same 404 bytes, after one read of a valid key", async () => {
    const h = handler(() => undefined);
    const real = encodeOperationRef("acct", "k", CLAIM);
    const body = Buffer.from(real.slice(3), "base64url");
    const flipped = Buffer.from(body);
    flipped[flipped.length - 20]! ^= 1;
    const forged = (parts: unknown) => `op_${Buffer.from(JSON.stringify(parts)).toString("base64url")}`;
    const refsOfOthers = new OperationRefs([{ id: "t1", secret: randomBytes(32) }]); // same id, other secret
    const cases = [
      "op_",
      "op_!!!",
      `op_${"A".repeat(5000)}`,
      forged(["acct", "k\u0000x"]), // the old, readable form, with a NUL in its key
      forged(["acct", "k", CLAIM]),
      `op_${flipped.toString("base64url")}`,
      real.slice(0, -4),
      refsOfOthers.encode("acct", "k", CLAIM),
      encodeOperationRef("acct_other", "k", CLAIM), // another account's
      encodeOperationRef("acct", "unknown"), // unknown (the reader finds nothing)
    ];
    const answers = [];
    for (const ref of cases) {
      const res = await h.get(`/${encodeURIComponent(ref)}`);
      answers.push({ status: res.status, body: await res.text(), type: res.headers.get("content-type") });
    }
    expect(new Set(answers.map((a) => JSON.stringify(a))).size).toBe(1);
    expect(answers[0]!.status).toBe(404);
    // One read each, of the caller's own scope and a key the key rules allow: nothing else is asked.
    expect(h.reads()).toBe(cases.length);
    for (const [scope, key] of h.asked) {
      expect(scope).toBe("acct");
      expect(key).toMatch(/^[\x21-\x7e]{1,255}$/);
    }
  });
});
