/**
 * Classification of one outcome, alone: what a response says (body fields first, the header as
 * fallback) and how a network error counts. These are the rules the attempt loop acts on.
 */
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { describe, expect, it } from "vitest";
import { classifyNetworkError, readAnswer } from "../../src/client/answer.ts";
import { DEFAULT_RETRY_STATUSES, defaultRetryPredicate } from "../../src/client/index.ts";

const problem = (status: number, body: unknown, headers: Record<string, string> = {}) =>
  new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/problem+json", ...headers },
  });

describe("readAnswer", () => {
  it("reads the contract's fields from a problem body and leaves the response unread", async () => {
    const res = problem(409, {
      type: "urn:idem:problem:operation-uncertain",
      operation_state: "uncertain",
      retry_same_key: false,
      safe_new_key: false,
      operation_ref: "op_9",
    });
    const answer = await readAnswer(res);
    expect(answer).toMatchObject({
      status: 409,
      type: "urn:idem:problem:operation-uncertain",
      operationState: "uncertain",
      retrySameKey: false,
      safeNewKey: false,
      operationRef: "op_9",
    });
    expect(res.bodyUsed).toBe(false);
    expect(await res.json()).toMatchObject({ operation_ref: "op_9" });
  });

  it("falls back to the Idempotency-Operation-State header; ignores unknown states and non-problem bodies", async () => {
    const byHeader = await readAnswer(
      new Response("{}", { status: 409, headers: { "idempotency-operation-state": "in_progress" } }),
    );
    expect(byHeader.operationState).toBe("in_progress");
    const bogus = await readAnswer(problem(409, { operation_state: "maybe", retry_same_key: "yes" }));
    expect(bogus.operationState).toBeUndefined();
    expect(bogus.retrySameKey).toBeUndefined();
    const notJson = await readAnswer(
      new Response("oops", { status: 503, headers: { "content-type": "application/problem+json" } }),
    );
    expect(notJson).toMatchObject({ status: 503 });
  });
});

describe("defaultRetryPredicate", () => {
  const retry = defaultRetryPredicate(new Set(DEFAULT_RETRY_STATUSES));
  const h = new Headers();
  it("follows retry_same_key when present, else in-flight and the statuses; other 409s are final", () => {
    expect(retry({ status: 503, headers: h, retrySameKey: false })).toBe(false);
    expect(retry({ status: 400, headers: h, retrySameKey: true })).toBe(true);
    expect(retry({ status: 409, headers: h, type: "urn:idem:problem:idempotency-key-in-flight" })).toBe(true);
    expect(retry({ status: 409, headers: h, operationState: "in_progress" })).toBe(true);
    expect(retry({ status: 409, headers: h, type: "urn:example:topup-id-taken" })).toBe(false);
    expect(retry({ status: 409, headers: h })).toBe(false);
    expect(retry({ status: 503, headers: h })).toBe(true);
    expect(retry({ status: 422, headers: h })).toBe(false);
  });
});

describe("classifyNetworkError", () => {
  it("a reply lost after the request was sent is a lost reply; a refused connection is unreachable", async () => {
    const server = createServer((req) => {
      req.resume();
      req.on("end", () => req.socket.destroy());
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
    const lost = await fetch(url, { method: "POST", body: "x" }).catch((e) => e);
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    const refused = await fetch(url, { method: "POST", body: "x" }).catch((e) => e);

    expect(classifyNetworkError(lost)).toBe("lost-reply");
    expect(classifyNetworkError(refused)).toBe("unreachable");
    expect(classifyNetworkError(new TypeError("Failed to fetch"))).toBe("unreachable"); // a browser's
    expect(classifyNetworkError(new DOMException("timed out", "TimeoutError"))).toBe("unreachable");
  });
});
