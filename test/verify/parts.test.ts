/** The pieces of idem verify on their own: the fault proxy, the seeded plan, templates, counting. */
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { listEffects, startFaultProxy, verify } from "../../src/testing/index.ts";
import { isCheckedProblem, problemFieldsError } from "../../src/testing/verify/fields.ts";
import { planIntents } from "../../src/testing/verify/plan.ts";
import { renderRequest, toParameterised, unknownPlaceholders } from "../../src/testing/verify/template.ts";

describe("the fault proxy", () => {
  let server: http.Server;
  let target: string;
  const handled: string[] = [];
  beforeAll(async () => {
    server = http.createServer((req, res) => {
      let body = "";
      req.on("data", (c) => {
        body += c;
      });
      req.on("end", () => {
        handled.push(`${req.method} ${req.url} ${req.headers["idempotency-key"] ?? "-"} ${body}`);
        res.writeHead(201, { "content-type": "application/json", "idempotent-replayed": "false" });
        res.end(JSON.stringify({ n: handled.length }));
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
    target = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  it("relays, drops a reply after the server answered, and holds one until the client gives up", async () => {
    const proxy = await startFaultProxy({ target });
    try {
      const post = (key: string, signal?: AbortSignal) =>
        fetch(`${proxy.url}/pay?x=1`, {
          method: "POST",
          headers: { "idempotency-key": key },
          body: "hello",
          signal: signal ?? null,
        });
      proxy.inject("k1", "drop");
      proxy.inject("k2", "hold");

      const relayed = await post("k0");
      expect(relayed.status).toBe(201);
      expect(await relayed.json()).toEqual({ n: 1 });

      // The server did the work; the client saw a reset connection. (Keys match quoted or bare.)
      const dropped = await post('"k1"').catch((e) => e);
      expect(dropped).toBeInstanceOf(TypeError);
      expect(handled[1]).toBe('POST /pay?x=1 "k1" hello');
      // Only the first request with the key is dropped: the retry gets through.
      expect((await post("k1")).status).toBe(201);

      const timedOut = await post("k2", AbortSignal.timeout(150)).catch((e) => e);
      expect((timedOut as Error).name).toBe("TimeoutError");
      await proxy.idle();

      expect(proxy.stats()).toEqual({ relayed: 2, dropped: 1, "timed-out": 1, failed: 0 });
      expect(proxy.exchanges("k1").map((e) => [e.status, e.fate, e.body])).toEqual([
        [201, "dropped", '{"n":2}'],
        [201, "relayed", '{"n":3}'],
      ]);
      expect(proxy.exchanges("k2")[0]).toMatchObject({ fate: "timed-out", replayed: false, status: 201 });
    } finally {
      await proxy.close();
    }
  });

  it("answers 502 when the target is down, and records it", async () => {
    const proxy = await startFaultProxy({ target: "http://127.0.0.1:9" });
    try {
      expect((await fetch(proxy.url)).status).toBe(502);
      expect(proxy.stats().failed).toBe(1);
    } finally {
      await proxy.close();
    }
  });
});

describe("the plan", () => {
  it("is the same for the same seed, and spreads the faults evenly", () => {
    const all = ["duplicate", "concurrent", "drop", "timeout", "mismatch", "scope"] as const;
    const a = planIntents({ intents: 40, faults: all, seed: 5 });
    expect(planIntents({ intents: 40, faults: all, seed: 5 })).toEqual(a);
    expect(planIntents({ intents: 40, faults: all, seed: 6 })).not.toEqual(a);
    for (const d of ["duplicate", "concurrent", "drop", "timeout"]) {
      expect(a.filter((p) => p.delivery === d)).toHaveLength(10);
    }
    expect(a.filter((p) => p.mismatch)).toHaveLength(10);
    expect(a.filter((p) => p.scope)).toHaveLength(10);
  });

  it("sends once when no delivery fault is chosen, and probes at least one intent", () => {
    const plans = planIntents({ intents: 2, faults: ["mismatch"], seed: 1 });
    expect(plans.map((p) => p.delivery)).toEqual(["once", "once"]);
    expect(plans.filter((p) => p.mismatch)).toHaveLength(1);
  });
});

describe("templates", () => {
  const vars = { amount: 1234, uuid: "u-1", n: 3, key: "k-9" };

  it("fill path, body and headers, and mark JSON bodies", () => {
    expect(
      renderRequest(
        { path: "/v1/{{n}}", body: '{"a":{{ amount }},"r":"{{uuid}}"}', headers: { "X-Ref": "{{key}}" } },
        vars,
      ),
    ).toEqual({
      method: "POST",
      path: "/v1/3",
      body: '{"a":1234,"r":"u-1"}',
      headers: { "x-ref": "k-9", "content-type": "application/json" },
    });
    expect(unknownPlaceholders("{{amount}} {{amonut}}")).toEqual(["amonut"]);
  });

  it("turn SQL placeholders into parameters, quoted or not", () => {
    expect(
      toParameterised("SELECT count(*) FROM t WHERE a = {{amount}} AND r = '{{uuid}}' OR a = {{amount}}"),
    ).toEqual({
      text: "SELECT count(*) FROM t WHERE a = $1 AND r = $2 OR a = $1",
      names: ["amount", "uuid"],
    });
  });

  it("count list items by marker fields, at a dot path", async () => {
    const counter = listEffects({
      url: "http://list.test/items",
      path: "page.data",
      match: { "meta.amount": "{{amount}}", currency: "eur" },
      fetch: async () =>
        Response.json({
          page: {
            data: [
              { meta: { amount: 1234 }, currency: "eur" },
              { meta: { amount: 1234 }, currency: "usd" },
              { meta: { amount: 1234 }, currency: "eur" },
              { meta: { amount: 5 }, currency: "eur" },
            ],
          },
        }),
    });
    expect(await counter.count([vars, { ...vars, amount: 5 }, { ...vars, amount: 6 }])).toEqual([2, 1, 0]);
  });
});

describe("the stuck-key check", () => {
  it("reports a key that keeps answering 409 past the lease", async () => {
    // Answers the first request of each key, then 409 "in progress" for ever: a claim never released.
    const seen = new Set<string>();
    const server = http.createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        const key = String(req.headers["idempotency-key"]);
        if (seen.has(key)) {
          res.writeHead(409, { "retry-after": "0" }).end('{"detail":"in progress"}');
        } else {
          seen.add(key);
          res.writeHead(201, { "content-type": "application/json" }).end('{"ok":true}');
        }
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
    try {
      const report = await verify({
        url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
        request: { path: "/pay", body: "{}" },
        faults: ["duplicate"],
        intents: 2,
        leaseSeconds: 1,
        requestTimeoutMs: 3_000, // the duplicate retries its 409s until lease + this
      });
      expect(report.ok).toBe(false);
      expect(report.violationsByKind).toEqual({ "stuck-in-flight": 2 });
      expect(report.violations[0]!.message).toMatch(/^still 409 after 1\.\d s \(the lease\)$/);
    } finally {
      await new Promise<void>((r) => server.close(() => r()));
    }
  });
});

describe("the problem-fields check", () => {
  const problem = (status: number, fields: Record<string, unknown>) => ({
    status,
    contentType: "application/problem+json",
    body: JSON.stringify({ type: "urn:idem:problem:idempotency-key-in-flight", status, ...fields }),
  });

  it("accepts the contract's fields and refuses what is missing, misspelt or misleading", () => {
    const inFlight = { operation_state: "in_progress", retry_same_key: true, safe_new_key: false };
    expect(problemFieldsError(problem(409, inFlight))).toBeUndefined();
    expect(problemFieldsError(problem(409, { ...inFlight, retry_same_key: false }))).toMatch(
      /a 409 in flight says retry_same_key false/,
    );
    expect(problemFieldsError(problem(409, {}))).toBe(
      "409 urn:idem:problem:idempotency-key-in-flight: no operation_state, no retry_same_key, no safe_new_key",
    );
    expect(problemFieldsError(problem(503, { ...inFlight, operation_state: "busy" }))).toMatch(
      /operation_state "busy" is not one of none, in_progress, done, failed_not_applied, uncertain/,
    );
    expect(problemFieldsError(problem(422, { ...inFlight, safe_new_key: "yes" }))).toMatch(
      /safe_new_key is not a boolean/,
    );
    expect(problemFieldsError({ status: 400, contentType: "application/json", body: "{}" })).toMatch(
      /^answered 400 application\/json, not application\/problem\+json/,
    );
    // Only problem+json answers are looked at, unless the answer can only be an idempotency problem.
    expect(isCheckedProblem({ status: 404, contentType: "text/plain", body: "" })).toBe(false);
    expect(isCheckedProblem({ status: 404, contentType: "text/plain", body: "" }, true)).toBe(true);
    expect(isCheckedProblem(problem(201, {}))).toBe(false);
    // Authentication is decided before any key is looked at: a wrong API key is not this check's.
    expect(isCheckedProblem(problem(401, {}), true)).toBe(false);
  });
});
