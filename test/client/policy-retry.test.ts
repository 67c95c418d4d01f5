/**
 * Which answers the client retries with the same key (issue 21), through the public
 * `defaultRetryPredicate` and a client whose `fetch` answers from a script: the server's
 * `retry_same_key` wins; otherwise an in-flight key and the retryable statuses are retried, and any
 * other answer (a plain 409 included) is final.
 */
import { describe, expect, it } from "vitest";
import { IN_FLIGHT_PROBLEM, isInFlight } from "../../src/client/answer.ts";
import {
  createClient,
  DEFAULT_RETRY_STATUSES,
  defaultRetryPredicate,
  type ServerAnswer,
} from "../../src/client/index.ts";

const retry = defaultRetryPredicate(new Set(DEFAULT_RETRY_STATUSES));
const answer = (status: number, more: Partial<ServerAnswer> = {}): ServerAnswer => ({
  status,
  headers: new Headers(),
  ...more,
});

describe("the default retry rule", () => {
  it("retries 408, 429, 500, 502, 503 and 504, and nothing else by status alone", () => {
    expect(DEFAULT_RETRY_STATUSES).toEqual([408, 429, 500, 502, 503, 504]);
    for (const s of [408, 429, 500, 502, 503, 504]) expect(retry(answer(s)), String(s)).toBe(true);
    for (const s of [400, 401, 402, 404, 409, 422, 501]) expect(retry(answer(s)), String(s)).toBe(false);
  });

  it("the server's retry_same_key wins over the status, both ways", () => {
    expect(retry(answer(503, { retrySameKey: false }))).toBe(false);
    expect(retry(answer(409, { retrySameKey: true }))).toBe(true);
  });

  it("an in-flight key is retried, said by the problem type or by the state alone", () => {
    expect(retry(answer(409, { type: IN_FLIGHT_PROBLEM }))).toBe(true);
    expect(retry(answer(409, { operationState: "in_progress" }))).toBe(true);
    expect(isInFlight(answer(409, { type: IN_FLIGHT_PROBLEM }))).toBe(true);
    expect(isInFlight(answer(409, { operationState: "in_progress" }))).toBe(true);
    expect(
      isInFlight(answer(409, { type: "urn:idem:problem:idempotency-key-mismatch", operationState: "none" })),
    ).toBe(false);
  });

  it("a client sends a plain 409 once, and an in-flight 409 again until it is answered", async () => {
    const sent: number[] = [];
    const script = [
      new Response(JSON.stringify({ type: IN_FLIGHT_PROBLEM }), {
        status: 409,
        headers: { "content-type": "application/problem+json", "retry-after": "0" },
      }),
      new Response("{}", { status: 201 }),
    ];
    const client = createClient({
      baseUrl: "http://pay.invalid",
      fetch: async () => {
        sent.push(1);
        return script.shift() ?? new Response(null, { status: 500 });
      },
    });
    expect((await client.post("/p", {})).status).toBe(201);
    expect(sent).toHaveLength(2);

    const plain = createClient({
      baseUrl: "http://pay.invalid",
      fetch: async () => {
        sent.push(2);
        return new Response(null, { status: 409 });
      },
    });
    expect((await plain.post("/p", {})).status).toBe(409);
    expect(sent.filter((s) => s === 2)).toHaveLength(1);
  });
});
