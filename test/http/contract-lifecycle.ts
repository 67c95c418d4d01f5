/**
 * The lifecycle cases every adapter runs besides the payments contract (contract.ts): the save policy
 * for requests without a key, bodies that can be read two ways, the contract's problem fields and
 * headers (docs/contract.md), replay authorization, phases routes, and the database going away.
 */
import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import fc from "fast-check";
import { expect, it } from "vitest";
import { type AppUnderTest, account, PROBLEM, postTo, problemOf, UNCERTAIN_AMOUNT } from "./contract.ts";

const STATE = "idempotency-operation-state";
const WITHIN = "idempotency-answer-within";

/** Random requests: any route, with or without an account, any key header, any content type and body. */
const randomRequest = fc.record({
  path: fc.constantFrom("/v1/payments", "/v1/tips", "/v1/phased"),
  withAccount: fc.boolean(),
  key: fc.oneof(
    fc.constant(undefined),
    fc.uuid(),
    fc.string({
      unit: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)),
      maxLength: 300,
    }),
    fc.uuid().map((u) => `"${u}"`),
  ),
  contentType: fc.constantFrom(
    "application/json",
    "application/json; charset=utf-8",
    "application/x-www-form-urlencoded",
    "text/plain",
    "application/octet-stream",
    "application/merge-patch+json",
  ),
  body: fc.oneof(
    fc.constant('{"amount_cents":5000,"currency":"eur"}'),
    fc.constant('{"amount_cents":5000,"currency":"eur","amount_cents":100}'),
    fc.constant("amount_cents=5000&currency=eur&amount_cents=100"),
    fc.json({ maxDepth: 3 }),
    fc.uint8Array({ maxLength: 64 }),
  ),
});

export function lifecycleContract(app: AppUnderTest): void {
  it("answers random headers and bodies with a 4xx or a normal answer, never a 5xx, and claims nothing on a 4xx", async () => {
    await fc.assert(
      fc.asyncProperty(randomRequest, async (r) => {
        const acct = account();
        const res = await fetch(app.url + r.path, {
          method: "POST",
          headers: {
            "content-type": r.contentType,
            ...(r.withAccount ? { "x-account": acct } : {}),
            ...(r.key === undefined ? {} : { "idempotency-key": r.key }),
          },
          body: r.body,
        });
        await res.arrayBuffer();
        expect(res.status).toBeLessThan(500);
        if (res.status >= 400) {
          expect(await app.keys(acct)).toBe(0);
          expect(await app.rows(acct)).toBe(0);
        }
      }),
      { numRuns: 40 },
    );
  }, 60_000);

  it("rolls back a request without a key whose handler returns a 5xx (the save policy, as with a key)", async () => {
    const acct = account();
    const res = await app.post("/v1/tips", { account: acct, headers: { "x-status": "503" } });
    expect(res.status).toBe(503);
    expect(await app.rows(acct)).toBe(0);
    const keyed = await app.post("/v1/tips", {
      account: acct,
      key: randomUUID(),
      headers: { "x-status": "503" },
    });
    expect(keyed.status).toBe(503);
    expect(await app.rows(acct)).toBe(0);
    expect(await app.keys(acct)).toBe(0);
    const ok = await app.post("/v1/tips", { account: acct });
    expect(ok.status).toBe(201);
    expect(await app.rows(acct)).toBe(1);
  });

  it("answers a duplicate JSON key (at any depth) 400 before claiming anything", async () => {
    const acct = account();
    for (const body of [
      '{"amount_cents":100,"currency":"eur","amount_cents":5000}',
      '{"amount_cents":100,"currency":"eur","meta":{"a":1,"\\u0061":2}}',
    ]) {
      const res = await app.post("/v1/payments", { account: acct, key: randomUUID(), body });
      expect(res.status).toBe(400);
      expect(await problemOf(res)).toMatchObject({
        type: `${PROBLEM}ambiguous-body`,
        operation_state: "none",
        retry_same_key: false,
        safe_new_key: true,
      });
    }
    expect(await app.rows(acct)).toBe(0);
    expect(await app.keys(acct)).toBe(0);
  });

  it("hands the handler the body it fingerprinted", async () => {
    const acct = account();
    const key = randomUUID();
    const first = await app.post("/v1/payments", {
      account: acct,
      key,
      body: '{"currency":"eur","amount_cents":700}',
    });
    expect(first.status).toBe(201);
    expect(await first.json()).toMatchObject({ amount_cents: 700, currency: "eur" });
  });

  it("tells the client what it may do next on 400, 422 and 409, with the answer bound on every keyed answer", async () => {
    const acct = account();
    const missing = await app.post("/v1/payments", { account: acct });
    expect(missing.headers.get(STATE)).toBe("none");
    expect(missing.headers.get(WITHIN)).toBe("1");
    expect(await problemOf(missing)).toMatchObject({
      type: `${PROBLEM}idempotency-key-missing`,
      operation_state: "none",
      retry_same_key: false,
      safe_new_key: true,
    });

    const key = randomUUID();
    const slow = app.post("/v1/payments", { account: acct, key, headers: { "x-sleep-ms": "2500" } });
    if (app.backend !== "pglite") await inFlight(acct, key); // PGlite runs one transaction at a time
    const done = await slow;
    expect(done.status).toBe(201);
    expect(done.headers.get(WITHIN)).toBe("1");
    expect(done.headers.get("idempotency-expires")).not.toBeNull();

    const other = await app.post("/v1/payments", {
      account: acct,
      key,
      body: { amount_cents: 1, currency: "eur" },
    });
    expect(other.status).toBe(422);
    expect(other.headers.get(WITHIN)).toBe("1");
    const mismatch = await problemOf(other);
    expect(mismatch).toMatchObject({ operation_state: "none", retry_same_key: false, safe_new_key: true });
    expect(app.store.refs.decode(mismatch.operation_ref as string)).toEqual({ scope: acct, key });

    const replay = await app.post("/v1/payments", { account: acct, key });
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(replay.headers.get(WITHIN)).toBe("1");
    expect(await app.rows(acct)).toBe(1);
  });

  /** A duplicate of a request that holds its key past the store's 1 s wait: 409 in flight. */
  async function inFlight(acct: string, key: string): Promise<void> {
    await sleep(300);
    const busy = await app.post("/v1/payments", { account: acct, key });
    expect(busy.status).toBe(409);
    expect(busy.headers.get("retry-after")).toMatch(/^\d+$/);
    expect(busy.headers.get(STATE)).toBe("in_progress");
    expect(busy.headers.get(WITHIN)).toBe("1");
    const problem = await problemOf(busy);
    expect(problem).toMatchObject({
      type: `${PROBLEM}idempotency-key-in-flight`,
      operation_state: "in_progress",
      retry_same_key: true,
      safe_new_key: false,
    });
    expect(app.store.refs.decode(problem.operation_ref as string)).toEqual({ scope: acct, key });
  }

  it("refuses a replay to a caller who may no longer see it: 401, nothing of the saved answer", async () => {
    const acct = account();
    const key = randomUUID();
    const first = await app.post("/v1/payments", { account: acct, key });
    const saved = (await first.json()) as { receipt: string };
    const revoked = await app.post("/v1/payments", { account: acct, key, headers: { "x-revoked": "1" } });
    expect(revoked.status).toBe(401);
    const text = await revoked.text();
    expect(text).not.toContain(saved.receipt);
    expect(revoked.headers.get("location")).toBeNull();
    expect(revoked.headers.get("idempotent-replayed")).toBeNull();
    const allowed = await app.post("/v1/payments", { account: acct, key });
    expect(allowed.headers.get("idempotent-replayed")).toBe("true");
    expect(await app.rows(acct)).toBe(1);
  });

  it("serves a phases route: runs once, replays the same bytes, 422 on another body, 400 without a key", async () => {
    const acct = account();
    const key = randomUUID();
    let first = await app.post("/v1/phased", { account: acct, key });
    // On a loaded machine (Citus's three nodes on two cores) the phases may outlast the route's 2 s
    // answer bound: 409 in flight while they go on; a retry with the key then gets what they ended in.
    for (let i = 0; first.status === 409 && i < 40; i++) {
      await new Promise((r) => setTimeout(r, 250));
      first = await app.post("/v1/phased", { account: acct, key });
    }
    expect(first.status).toBe(201);
    expect(first.headers.get(WITHIN)).toBe("2");
    const body = await first.text();
    const retry = await app.post("/v1/phased", { account: acct, key });
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(await retry.text()).toBe(body);
    const other = await app.post("/v1/phased", {
      account: acct,
      key,
      body: { amount_cents: 9, currency: "eur" },
    });
    expect(other.status).toBe(422);
    const missing = await app.post("/v1/phased", { account: acct });
    expect(missing.status).toBe(400);
    const revoked = await app.post("/v1/phased", { account: acct, key, headers: { "x-revoked": "1" } });
    expect(revoked.status).toBe(401);
    expect(await revoked.text()).not.toContain(body);
    expect(await app.rows(acct)).toBe(1);
    // The "provider" knows the call by this claim of the key (`ctx.idempotencyKey`: scope:claim id).
    const calls = await app.db.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM external_calls e
         JOIN idem.keys k ON e.key = k.scope || ':' || k.claim_id::text
        WHERE k.scope = $1 AND k.key = $2 AND NOT k.marker`,
      [acct, key],
    );
    expect(calls.rows[0]!.n).toBe(1);
  });

  it("answers an unknown outcome 409 operation-uncertain: no retry with any key, the ref for a person", async () => {
    const acct = account();
    const key = randomUUID();
    const res = await app.post("/v1/phased", {
      account: acct,
      key,
      body: { amount_cents: UNCERTAIN_AMOUNT, currency: "eur" },
    });
    expect(res.status).toBe(409);
    expect(res.headers.get("retry-after")).toBeNull();
    expect(res.headers.get(STATE)).toBe("uncertain");
    const problem = await problemOf(res);
    expect(problem).toMatchObject({
      type: `${PROBLEM}operation-uncertain`,
      operation_state: "uncertain",
      retry_same_key: false,
      safe_new_key: false,
    });
    // The phase's own reference (`ctx.operationRef`): this claim of the key.
    expect(app.store.refs.decode(problem.operation_ref as string)).toEqual({
      scope: acct,
      key,
      claimId: expect.any(String),
    });
  });

  it("answers 503 problem+json with Retry-After while the database is unreachable, then recovers", async (ctx) => {
    const down = app.down;
    if (!down) return ctx.skip(); // needs the real server (DATABASE_URL)
    const acct = account();
    const key = randomUUID();
    down.setDown(true);
    try {
      for (const path of ["/v1/payments", "/v1/phased"]) {
        const res = await postTo(down.url, path, { account: acct, key });
        expect(res.status).toBe(503);
        expect(res.headers.get("retry-after")).toMatch(/^\d+$/);
        const problem = await problemOf(res);
        expect(problem).toMatchObject({ type: `${PROBLEM}retryable-failure`, retry_same_key: true });
        expect(res.headers.get(STATE)).toBe(problem.operation_state);
      }
      const unkeyed = await postTo(down.url, "/v1/tips", { account: acct });
      expect(unkeyed.status).toBe(503);
      expect(unkeyed.headers.get("retry-after")).toMatch(/^\d+$/);
    } finally {
      down.setDown(false);
    }
    // A client honouring Retry-After: postgres.js's first statement on a connection cut during the
    // outage fails too (seen on Node, Bun and Deno), answered 503 again; pg's pool recovers at once.
    let retry = await postTo(down.url, "/v1/payments", { account: acct, key });
    for (let i = 0; retry.status === 503 && i < 5; i++) {
      await sleep(Number(retry.headers.get("retry-after")) * 1000);
      retry = await postTo(down.url, "/v1/payments", { account: acct, key });
    }
    expect(retry.status).toBe(201);
    expect(await app.rows(acct)).toBe(1);
  }, 30_000);
}

/** What `onError` received, kept where the app runs (another process's through its own route). */
export interface CrashLog {
  clear(): Promise<void>;
  read(): Promise<unknown[]>;
}

/**
 * For the adapters that read the body and answer errors themselves (node:http, Web-standard): the
 * handler's error reaches `onError` (collected in `crashes`) as a 500 problem, and a body past the limit
 * is a 413 that saves nothing.
 */
export function ownBodyContract(app: AppUnderTest, crashes: unknown[] | CrashLog): void {
  const log: CrashLog = Array.isArray(crashes)
    ? {
        clear: async () => {
          crashes.length = 0;
        },
        read: async () => crashes,
      }
    : crashes;
  it("hands the handler's error to onError and answers 500 problem+json", async () => {
    await log.clear();
    const res = await app.post("/v1/payments", {
      account: account(),
      key: randomUUID(),
      headers: { "x-crash": "1" },
    });
    expect(res.status).toBe(500);
    expect(res.headers.get("content-type")).toBe("application/problem+json");
    expect(await log.read()).toEqual([
      expect.objectContaining({ message: "the handler crashed after its insert" }),
    ]);
  });

  it("answers a body over the limit 413 problem+json and saves nothing", async () => {
    const acct = account();
    const res = await app.post("/v1/small", {
      account: acct,
      key: randomUUID(),
      body: { amount_cents: 5000, currency: "eur", note: "x".repeat(200) },
    });
    expect(res.status).toBe(413);
    expect(await res.json()).toMatchObject({ type: "urn:idem:problem:body-too-large", status: 413 });
    expect(await app.rows(acct)).toBe(0);
    expect(await app.keys(acct)).toBe(0);
  });
}
