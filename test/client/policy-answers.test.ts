/**
 * How the client reads a server's answer and hints (issue 21), through the public `idem/client`
 * functions: problem+json fields, the operation-state header, Retry-After, Idempotency-Answer-Within,
 * Idempotency-Expires, network failures, and the retry budget's limits.
 */
import { describe, expect, it } from "vitest";
import {
  answerWithinMs,
  classifyNetworkError,
  expiresAt,
  IN_FLIGHT_PROBLEM,
  isInFlight,
  isUncertain,
  readAnswer,
  UNCERTAIN_PROBLEM,
} from "../../src/client/answer.ts";
import { createClient, RetryBudget } from "../../src/client/index.ts";
import { parseRetryAfter } from "../../src/client/retry-after.ts";

const problem = (body: unknown, headers: Record<string, string> = {}, status = 409) =>
  new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/problem+json", ...headers },
  });

describe("Retry-After", () => {
  it("whole and decimal seconds, with surrounding spaces", () => {
    expect(parseRetryAfter("3")).toBe(3_000);
    expect(parseRetryAfter(" 0 ")).toBe(0);
    expect(parseRetryAfter("1.5")).toBe(1_500);
    expect(parseRetryAfter("0.25")).toBe(250);
  });

  it("an HTTP date: the time until then, 0 when past", () => {
    const now = Date.parse("Mon, 30 Nov 2026 12:00:00 GMT");
    expect(parseRetryAfter("Mon, 30 Nov 2026 12:00:05 GMT", now)).toBe(5_000);
    expect(parseRetryAfter("Mon, 30 Nov 2026 11:00:00 GMT", now)).toBe(0);
  });

  it("absent, empty or unreadable: no hint", () => {
    for (const v of [null, undefined, "", "soon", "-1", "1.", ".5", "1.5.2", "1e3"]) {
      expect(parseRetryAfter(v), String(v)).toBeUndefined();
    }
  });
});

describe("the server's answer", () => {
  it("reads every contract field of a problem+json body (with a charset parameter)", async () => {
    const a = await readAnswer(
      problem(
        {
          type: IN_FLIGHT_PROBLEM,
          operation_state: "in_progress",
          retry_same_key: true,
          safe_new_key: false,
          operation_ref: "op_7",
        },
        { "content-type": "Application/Problem+JSON; charset=utf-8" },
      ),
    );
    expect(a).toMatchObject({
      status: 409,
      type: IN_FLIGHT_PROBLEM,
      operationState: "in_progress",
      retrySameKey: true,
      safeNewKey: false,
      operationRef: "op_7",
    });
    expect(isInFlight(a)).toBe(true);
  });

  it("ignores fields of the wrong type or an unknown state", async () => {
    const a = await readAnswer(
      problem({
        type: 5,
        operation_state: "bogus",
        retry_same_key: "yes",
        safe_new_key: 1,
        operation_ref: 7,
      }),
    );
    expect(a.type).toBeUndefined();
    expect(a.operationState).toBeUndefined();
    expect(a.retrySameKey).toBeUndefined();
    expect(a.safeNewKey).toBeUndefined();
    expect(a.operationRef).toBeUndefined();
  });

  it("does not read a body that is not problem+json, even if it looks like one", async () => {
    const body = { type: UNCERTAIN_PROBLEM, operation_state: "uncertain", retry_same_key: false };
    for (const type of ["application/json", "text/plain", "x-application/problem+json"]) {
      const a = await readAnswer(problem(body, { "content-type": type }));
      expect(a.type, type).toBeUndefined();
      expect(a.operationState, type).toBeUndefined();
      expect(isUncertain(a), type).toBe(false);
    }
    const untyped = await readAnswer(new Response(JSON.stringify(body), { status: 409 }));
    expect(untyped.type).toBeUndefined();
  });

  it("a problem+json body that is not a JSON object is judged by status and headers", async () => {
    for (const text of ["null", "not json", '"text"', "42"]) {
      const a = await readAnswer(
        new Response(text, {
          status: 503,
          headers: { "content-type": "application/problem+json", "idempotency-operation-state": "none" },
        }),
      );
      expect(a.status).toBe(503);
      expect(a.operationState).toBe("none");
    }
  });

  it("the state header counts when the body has none; the body wins when both say", async () => {
    const fromHeader = await readAnswer(
      new Response(null, { status: 409, headers: { "idempotency-operation-state": " uncertain " } }),
    );
    expect(fromHeader.operationState).toBe("uncertain");
    expect(isUncertain(fromHeader)).toBe(true);
    const unknown = await readAnswer(
      new Response(null, { status: 409, headers: { "idempotency-operation-state": "maybe" } }),
    );
    expect(unknown.operationState).toBeUndefined();
    const both = await readAnswer(
      problem({ operation_state: "done" }, { "idempotency-operation-state": "in_progress" }),
    );
    expect(both.operationState).toBe("done");
  });

  it("the body's answer stays readable by the caller", async () => {
    const res = problem({ type: "urn:x" });
    await readAnswer(res);
    expect(await res.json()).toEqual({ type: "urn:x" });
  });

  it("uncertain is said by the state or by the problem type, either one", () => {
    const h = new Headers();
    expect(UNCERTAIN_PROBLEM).toBe("urn:idem:problem:operation-uncertain");
    expect(isUncertain({ status: 409, headers: h, type: UNCERTAIN_PROBLEM })).toBe(true);
    expect(isUncertain({ status: 409, headers: h, operationState: "uncertain" })).toBe(true);
    expect(
      isUncertain({ status: 409, headers: h, type: IN_FLIGHT_PROBLEM, operationState: "in_progress" }),
    ).toBe(false);
  });

  it("Idempotency-Answer-Within: seconds to ms; negative, infinite or unreadable means none", () => {
    const within = (v?: string) =>
      answerWithinMs(new Headers(v === undefined ? {} : { "idempotency-answer-within": v }));
    expect(within("2")).toBe(2_000);
    expect(within(" 5 ")).toBe(5_000);
    expect(within("0")).toBe(0);
    expect(within(undefined)).toBeUndefined();
    expect(within("-1")).toBeUndefined();
    expect(within("abc")).toBeUndefined();
    expect(within("Infinity")).toBeUndefined();
  });

  it("Idempotency-Expires: an ISO timestamp when readable", () => {
    const at = (v?: string) => expiresAt(new Headers(v === undefined ? {} : { "idempotency-expires": v }));
    expect(at("Tue, 01 Dec 2026 12:00:00 GMT")).toBe("2026-12-01T12:00:00.000Z");
    expect(at("whenever")).toBeUndefined();
    expect(at(undefined)).toBeUndefined();
  });
});

describe("a failure with no response", () => {
  const failed = (code: string | undefined, bytesWritten?: number) => {
    const cause: Record<string, unknown> = { code };
    if (bytesWritten !== undefined) cause.socket = { bytesWritten };
    return new TypeError("fetch failed", { cause });
  };

  it("a connection closed after the request was sent is a lost reply", () => {
    expect(classifyNetworkError(failed("UND_ERR_SOCKET", 120))).toBe("lost-reply");
    expect(classifyNetworkError(failed("UND_ERR_SOCKET"))).toBe("lost-reply");
    expect(classifyNetworkError(failed("ECONNRESET"))).toBe("lost-reply");
    expect(classifyNetworkError(failed("EPIPE"))).toBe("lost-reply");
  });

  it("a connection that never carried the request, or any other failure, is unreachable", () => {
    expect(classifyNetworkError(failed("UND_ERR_SOCKET", 0))).toBe("unreachable");
    expect(classifyNetworkError(failed("ECONNREFUSED"))).toBe("unreachable");
    expect(classifyNetworkError(failed(undefined))).toBe("unreachable");
    expect(classifyNetworkError(new TypeError("Failed to fetch"))).toBe("unreachable");
    expect(classifyNetworkError(undefined)).toBe("unreachable");
    expect(classifyNetworkError(new DOMException("timed out", "TimeoutError"))).toBe("unreachable");
  });
});

describe("the retry budget's limits", () => {
  it("a negative or missing ratio or cap is a RangeError, for the budget and for the client", () => {
    for (const options of [{ ratio: -0.1 }, { cap: -1 }, { ratio: Number.NaN }, { cap: Number.NaN }]) {
      expect(() => new RetryBudget(options)).toThrow(
        new RangeError("RetryBudget: ratio and cap must be >= 0"),
      );
      expect(() => createClient({ budget: options })).toThrow(RangeError);
    }
  });

  it("a budget of 0 is allowed and refuses every retry", () => {
    const none = new RetryBudget({ ratio: 0, cap: 0 });
    none.recordRequest();
    expect(none.tokens).toBe(0);
    expect(none.tryRetry()).toBe(false);
  });
});
