/**
 * The request lifecycle every adapter delegates to (issue 21), over HTTP through the Hono adapter
 * (`app.request`, no socket): what a keyed request is answered first and on replay (headers, expiry,
 * the answer bound, `operation_state`), what is saved and what rolls back, how requests are compared,
 * compact replays, replay authorization, requests without a key, phases routes, and how every failure
 * a store or runner can report is answered and reported to `onOutcome`.
 *
 * Stores: idem's PostgresStore (the real server with DATABASE_URL, else PGlite), and for the failures no single-connection database can
 * produce (another holder of the key, a lost connection), a store that answers with a given error.
 */
import { Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  type AtomicOutcome,
  type AtomicStore,
  type Claim,
  IdemError,
  KeyInFlightError,
  KeyMismatchError,
  LeaseLostError,
  OperationUncertainError,
  type OutcomeEvent,
  type PhasesRunnerLike,
  RetryableError,
  refsOf,
  type Tx,
} from "../../src/core/index.ts";
import {
  type HonoIdempotencyOptions,
  type IdempotencyEnv,
  idempotency,
  idempotentPhases,
} from "../../src/http/hono.ts";
import { idempotency as webIdempotency } from "../../src/http/web.ts";
import { PostgresStore } from "../../src/postgres/index.ts";
import { type CoreDb, openCoreDb } from "./app.ts";

const SCOPE = "acct_lc";
const JSON_CT = { "content-type": "application/json" };
let core: CoreDb;
let store: PostgresStore;
let rows: string;
let keyN = 0;
const newKey = () => `lc-${Date.now()}-${++keyN}`;

beforeAll(async () => {
  core = await openCoreDb();
  rows = `${core.schema}.lc_rows`;
  await core.db.exec(`CREATE TABLE ${rows} (note text NOT NULL)`);
  store = await PostgresStore.open(core.db, { schema: core.schema, lockTimeoutMs: 1_500 });
});
afterAll(() => core?.close());

const rowsOf = async (note: string) =>
  Number(
    (await core.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${rows} WHERE note = $1`, [note]))
      .rows[0]!.n,
  );

type Options = Partial<HonoIdempotencyOptions> & { store?: AtomicStore<Tx> };

/**
 * A route at /r whose handler writes a row (`x-note`) in the request's transaction and answers
 * `x-status` (default 201) with the headers in `x-reply-headers` (JSON) and a body naming its run.
 */
function route(options: Options = {}) {
  const events: OutcomeEvent[] = [];
  let runs = 0;
  const app = new Hono<IdempotencyEnv>();
  app.onError((err, c) => c.text(`app error: ${err.message}`, 500));
  app.post(
    "/r/*",
    idempotency({
      store,
      onOutcome: (e) => events.push(e),
      scope: (c) => (c.req.header("x-anonymous") ? undefined : SCOPE),
      ...options,
    }),
    async (c) => {
      runs++;
      const note = c.req.header("x-note");
      if (note) await c.var.idempotency.tx.query(`INSERT INTO ${rows} (note) VALUES ($1)`, [note]);
      const headers = JSON.parse(c.req.header("x-reply-headers") ?? "{}") as Record<string, string>;
      return c.body(
        JSON.stringify({ run: runs, key: c.var.idempotency.key, body: c.var.idempotency.body }),
        Number(c.req.header("x-status") ?? 201) as 201,
        { "content-type": "application/json", ...headers },
      );
    },
  );
  const send = (
    init: { key?: string; body?: string; headers?: Record<string, string>; path?: string } = {},
  ) => {
    const h = new Headers({ ...JSON_CT, ...init.headers });
    if (init.key !== undefined) h.set("idempotency-key", init.key);
    return Promise.resolve(
      app.request(`http://idem.test${init.path ?? "/r/x"}`, {
        method: "POST",
        body: init.body ?? "{}",
        headers: h,
      }),
    );
  };
  return { send, events, runs: () => runs };
}

/** A store that answers every claim with `error` (what PGlite, with one connection, cannot produce). */
function failingStore(error: () => unknown, lockTimeoutMs?: number): AtomicStore<Tx> {
  return {
    retentionMs: 60_000,
    lockTimeoutMs,
    atomic: async () => {
      throw error();
    },
    transaction: async () => {
      throw error();
    },
  };
}

const socketError = (code: string) => Object.assign(new Error(`connect ${code}`), { code });

describe("a keyed request and its replay", () => {
  it("replays the same status and bytes with the allow-listed headers, marked replayed, with the key's expiry", async () => {
    const r = route();
    const key = newKey();
    const replyHeaders = JSON.stringify({ etag: '"v1"', "x-trace": "t1", "set-cookie": "sid=1" });
    const first = await r.send({ key, body: '{"a":1}', headers: { "x-reply-headers": replyHeaders } });
    const firstBody = await first.text();
    expect(first.status).toBe(201);
    expect(first.headers.get("idempotent-replayed")).toBeNull();
    expect(first.headers.get("idempotency-answer-within")).toBe("2"); // lockTimeoutMs 1,500 rounded up
    expect(first.headers.get("x-trace")).toBe("t1");
    expect(first.headers.get("idempotency-operation-state")).toBeNull();
    const expires = first.headers.get("idempotency-expires")!;
    expect(Date.parse(expires) - Date.now()).toBeGreaterThan(store.retentionMs - 60_000);
    expect(new Date(Date.parse(expires)).toUTCString()).toBe(expires);

    const again = await r.send({ key, body: '{"a":1}', headers: { "x-reply-headers": "{}" } });
    expect(again.status).toBe(201);
    expect(await again.text()).toBe(firstBody);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(again.headers.get("idempotency-expires")).toBe(expires);
    expect(again.headers.get("idempotency-answer-within")).toBe("2");
    expect(again.headers.get("etag")).toBe('"v1"');
    expect(again.headers.get("x-trace")).toBeNull();
    expect(again.headers.get("set-cookie")).toBeNull();
    expect(again.headers.get("idempotency-operation-state")).toBeNull();
    expect(r.runs()).toBe(1);
    expect(r.events).toEqual([
      { outcome: "executed", status: 201, scope: SCOPE, key },
      { outcome: "replayed", status: 201, scope: SCOPE, key },
    ]);
  });

  it("replays only the headers the route lists, and never Set-Cookie", async () => {
    const r = route({ replayHeaders: ["X-Trace", "set-cookie"] });
    const key = newKey();
    const replyHeaders = JSON.stringify({ etag: '"v1"', "x-trace": "t1", "set-cookie": "sid=1" });
    await r.send({ key, headers: { "x-reply-headers": replyHeaders } });
    const again = await r.send({ key });
    expect(again.headers.get("x-trace")).toBe("t1");
    expect(again.headers.get("etag")).toBeNull();
    expect(again.headers.get("content-type")).toBeNull();
    expect(again.headers.get("set-cookie")).toBeNull();
  });

  it("a 5xx is not saved: its writes roll back, no expiry is promised, and the same key runs again", async () => {
    const r = route();
    const key = newKey();
    const note = `5xx-${key}`;
    const failed = await r.send({ key, headers: { "x-status": "503", "x-note": note } });
    expect(failed.status).toBe(503);
    expect(failed.headers.get("idempotency-expires")).toBeNull();
    expect(failed.headers.get("idempotency-operation-state")).toBeNull();
    expect(failed.headers.get("idempotency-answer-within")).toBe("2");
    expect(await rowsOf(note)).toBe(0);
    const retried = await r.send({ key, headers: { "x-note": note } });
    expect(retried.status).toBe(201);
    expect(retried.headers.get("idempotent-replayed")).toBeNull();
    expect(await rowsOf(note)).toBe(1);
    expect(r.runs()).toBe(2);
    expect(r.events.map((e) => e.outcome)).toEqual(["not_saved", "executed"]);
    expect(r.events[0]).toEqual({ outcome: "not_saved", status: 503, scope: SCOPE, key });
  });

  it("a saved 4xx tells the client nothing was applied, first and on replay, unless the answer says so itself", async () => {
    const r = route({
      saveStatuses: [400, 402, 451, 302],
      saveServerErrors: true,
      replayHeaders: ["content-type"],
    });
    for (const status of [400, 402, 451]) {
      const key = newKey();
      const first = await r.send({ key, headers: { "x-status": String(status) } });
      expect(first.status).toBe(status);
      expect(first.headers.get("idempotency-operation-state"), `${status}`).toBe("failed_not_applied");
      const again = await r.send({ key });
      expect(again.status).toBe(status);
      expect(again.headers.get("idempotent-replayed")).toBe("true");
      expect(again.headers.get("idempotency-operation-state"), `${status} replayed`).toBe(
        "failed_not_applied",
      );
    }
    for (const status of [302, 500]) {
      const key = newKey();
      const first = await r.send({
        key,
        headers: { "x-status": String(status), "x-reply-headers": '{"location":"/x"}' },
      });
      expect(first.headers.get("idempotency-expires"), `${status} is saved`).not.toBeNull();
      expect(first.headers.get("idempotency-operation-state"), `${status}`).toBeNull();
      const again = await r.send({ key });
      expect(again.headers.get("idempotent-replayed")).toBe("true");
      expect(again.headers.get("idempotency-operation-state"), `${status} replayed`).toBeNull();
    }
    const own = route({ replayHeaders: ["content-type", "idempotency-operation-state"] });
    const key = newKey();
    const stated = JSON.stringify({ "Idempotency-Operation-State": "done" });
    const first = await own.send({ key, headers: { "x-status": "402", "x-reply-headers": stated } });
    expect(first.headers.get("idempotency-operation-state")).toBe("done");
    const again = await own.send({ key });
    expect(again.headers.get("idempotency-operation-state")).toBe("done");
  });

  it("refuses a replay to a caller who may no longer see it: 401, nothing of the saved answer", async () => {
    let allowed = true;
    const r = route({ authorizeReplay: () => allowed });
    const key = newKey();
    allowed = false;
    const first = await r.send({ key, body: '{"secret":"s1"}' });
    expect(first.status).toBe(201); // executing needs no replay permission
    const refused = await r.send({ key, body: '{"secret":"s1"}' });
    expect(refused.status).toBe(401);
    expect(refused.headers.get("content-type")).toBe("application/problem+json");
    expect(refused.headers.get("idempotency-answer-within")).toBe("2");
    const text = await refused.text();
    expect(text).not.toContain("s1");
    expect(JSON.parse(text)).toMatchObject({
      type: "urn:idem:problem:unauthorized",
      status: 401,
      detail: "You may no longer see the answer saved under this Idempotency-Key.",
    });
    allowed = true;
    const replay = await r.send({ key, body: '{"secret":"s1"}' });
    expect(replay.status).toBe(201);
    expect(await replay.text()).toContain("s1");
    expect(r.events.map((e) => [e.outcome, e.status])).toEqual([
      ["executed", 201],
      ["invalid", 401],
      ["replayed", 201],
    ]);
  });
});

describe("what the store is asked to do", () => {
  it("start the work with the claim only on a route that promises effectsInTxOnly, never with compact", async () => {
    const asked: Array<{ speculate: unknown; signal: boolean }> = [];
    const recording: AtomicStore<Tx> = {
      retentionMs: store.retentionMs,
      lockTimeoutMs: store.lockTimeoutMs,
      transaction: (work) => store.transaction(work),
      atomic: (claim, work, options) => {
        asked.push({ speculate: options?.speculate, signal: typeof options?.signal?.aborted === "boolean" });
        return store.atomic(claim, work, options);
      },
    };
    const compact = {
      id: () => undefined,
      rebuild: () => ({ status: 200, headers: [], body: new Uint8Array() }),
    };
    await route({ store: recording }).send({ key: newKey() });
    await route({ store: recording, effectsInTxOnly: true }).send({ key: newKey() });
    const spec = await route({ store: recording, effectsInTxOnly: true, compact }).send({ key: newKey() });
    expect(spec.status).toBe(201);
    expect(asked).toEqual([
      { speculate: false, signal: true },
      { speculate: true, signal: true },
      { speculate: undefined, signal: true },
    ]);
  });

  it("run a request without a key in the caller's scope (a store over several databases picks theirs)", async () => {
    const scopes: unknown[] = [];
    const recording: AtomicStore<Tx> = {
      retentionMs: store.retentionMs,
      atomic: (claim, work, options) => store.atomic(claim, work, options),
      transaction: (work, options) => {
        scopes.push(options?.scope);
        return store.transaction(work);
      },
    };
    const r = route({ store: recording, required: false });
    expect((await r.send({})).status).toBe(201);
    expect((await r.send({ headers: { "x-anonymous": "1" } })).status).toBe(201);
    expect(scopes).toEqual([SCOPE, undefined]);
  });
});

describe("what counts as the same request", () => {
  it("by default: method, path and body as read (keys in any order)", async () => {
    const r = route();
    const key = newKey();
    expect((await r.send({ key, body: '{"a":1,"b":2}' })).status).toBe(201);
    expect((await r.send({ key, body: '{ "b":2, "a":1 }' })).headers.get("idempotent-replayed")).toBe("true");
    expect((await r.send({ key, body: '{"a":1,"b":3}' })).status).toBe(422);
    expect((await r.send({ key, body: '{"a":1,"b":2}', path: "/r/y" })).status).toBe(422);
  });

  it("with `fields`: only those body fields, whatever else the body holds", async () => {
    const r = route({ fingerprint: { fields: ["amount", "currency"] } });
    const key = newKey();
    expect((await r.send({ key, body: '{"amount":5,"currency":"eur","note":"a"}' })).status).toBe(201);
    const same = await r.send({ key, body: '{"currency":"eur","amount":5,"note":"b"}' });
    expect(same.headers.get("idempotent-replayed")).toBe("true");
    expect((await r.send({ key, body: '{"amount":6,"currency":"eur"}' })).status).toBe(422);
    expect((await r.send({ key, body: '{"amount":5}' })).status).toBe(422);
    // A body with no fields to pick (bytes, null) compares as no fields at all.
    const raw = newKey();
    const text = { "content-type": "text/plain" };
    expect((await r.send({ key: raw, body: "one", headers: text })).status).toBe(201);
    expect((await r.send({ key: raw, body: "two", headers: text })).headers.get("idempotent-replayed")).toBe(
      "true",
    );
    expect((await r.send({ key: raw, body: "null" })).headers.get("idempotent-replayed")).toBe("true");
    expect((await r.send({ key: raw, body: "{}" })).headers.get("idempotent-replayed")).toBe("true");
    expect((await r.send({ key: raw, body: '{"amount":1}' })).status).toBe(422);
  });

  it("with a function: whatever it returns for the request and its body", async () => {
    const seen: unknown[] = [];
    const r = route({
      fingerprint: (req, body) => {
        seen.push([req.method, req.path, body.value]);
        return new TextEncoder().encode(String(req.header("x-order")));
      },
    });
    const key = newKey();
    expect((await r.send({ key, body: '{"a":1}', headers: { "x-order": "o1" } })).status).toBe(201);
    expect(seen).toEqual([["POST", "/r/x?q=1".slice(0, 4), { a: 1 }]]);
    const other = await r.send({ key, body: '{"a":2}', headers: { "x-order": "o1" } });
    expect(other.headers.get("idempotent-replayed")).toBe("true");
    expect((await r.send({ key, body: '{"a":1}', headers: { "x-order": "o2" } })).status).toBe(422);
  });

  it("a form field the route declares repeatable keeps its values in order; another repeated one is 400", async () => {
    const r = route({ repeatable: ["tag"] });
    const form = { "content-type": "application/x-www-form-urlencoded" };
    const ok = await r.send({ key: newKey(), body: "tag=b&tag=a&x=1", headers: form });
    expect(ok.status).toBe(201);
    expect(((await ok.json()) as { body: unknown }).body).toEqual({ tag: ["b", "a"], x: "1" });
    expect((await r.send({ key: newKey(), body: "x=1&x=2", headers: form })).status).toBe(400);
    // Sent twice is not the same request as one value holding a comma.
    const key = newKey();
    expect((await r.send({ key, body: "tag=a&tag=b", headers: form })).status).toBe(201);
    expect((await r.send({ key, body: "tag=a%2Cb", headers: form })).status).toBe(422);
    expect(
      (await r.send({ key, body: "tag=a&tag=b", headers: form })).headers.get("idempotent-replayed"),
    ).toBe("true");
  });
});

describe("compact storage", () => {
  const compactRoute = () =>
    route({
      replayHeaders: ["content-type", "location"],
      compact: {
        id: (res) =>
          res.status === 201 ? `pay_${JSON.parse(new TextDecoder().decode(res.body)).run}` : undefined,
        rebuild: async (saved, tx) => {
          const { rows } = await (tx as Tx).query<{ n: number }>("SELECT 7 AS n");
          return {
            status: 200,
            headers: [
              ["content-type", "application/json"],
              ["location", `/payments/${saved.id}`],
              ["x-trace", "rebuilt"],
            ],
            body: new TextEncoder().encode(JSON.stringify({ id: saved.id, n: rows[0]!.n })),
          };
        },
      },
    });

  it("replays what the route rebuilds from the saved status and id, with the allow-listed headers", async () => {
    const r = compactRoute();
    const key = newKey();
    const first = await r.send({ key });
    expect(first.status).toBe(201);
    const { run } = (await first.json()) as { run: number };
    const again = await r.send({ key });
    expect(again.status).toBe(201); // the saved status, not the rebuilt one
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(again.headers.get("location")).toBe(`/payments/pay_${run}`);
    expect(again.headers.get("x-trace")).toBeNull();
    expect(await again.json()).toEqual({ id: `pay_${run}`, n: 7 });
    expect(r.runs()).toBe(1);
  });

  it("saves in full a reply with no resource id (a decline)", async () => {
    const r = compactRoute();
    const key = newKey();
    const first = await r.send({ key, headers: { "x-status": "402" } });
    const firstBody = await first.text();
    const again = await r.send({ key });
    expect(again.status).toBe(402);
    expect(await again.text()).toBe(firstBody);
  });
});

describe("requests without a key, on a route where it is optional", () => {
  it("commit like a keyed request would be saved, roll back otherwise, and are still answered", async () => {
    const r = route({ required: false });
    for (const [status, kept] of [
      [201, 1],
      [402, 1],
      [503, 0],
      [409, 0],
    ] as const) {
      const note = `unkeyed-${status}-${newKey()}`;
      const res = await r.send({ headers: { "x-status": String(status), "x-note": note } });
      expect(res.status).toBe(status);
      expect(((await res.json()) as { key: unknown }).key).toBeUndefined();
      expect(res.headers.get("idempotency-answer-within")).toBeNull();
      expect(await rowsOf(note), `${status}`).toBe(kept);
    }
    expect(r.events).toEqual([
      { outcome: "unkeyed", status: 201, scope: SCOPE },
      { outcome: "unkeyed", status: 402, scope: SCOPE },
      { outcome: "unkeyed", status: 503, scope: SCOPE },
      { outcome: "unkeyed", status: 409, scope: SCOPE },
    ]);
  });

  it("the database down: 503 retryable, without an answer bound (there is no key to bind)", async () => {
    const r = route({ required: false, store: failingStore(() => socketError("ECONNREFUSED")) });
    const res = await r.send({});
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBe("1");
    expect(res.headers.get("idempotency-answer-within")).toBeNull();
    expect(await res.json()).toMatchObject({
      operation_state: "none",
      retry_same_key: true,
      safe_new_key: true,
    });
  });

  it("a handler error is the application's to answer", async () => {
    const app = new Hono<IdempotencyEnv>();
    app.onError((err, c) => c.text(`app error: ${err.message}`, 500));
    app.post("/u", idempotency({ store, required: false, scope: () => SCOPE }), () => {
      throw new Error("handler broke");
    });
    const res = await app.request("http://idem.test/u", { method: "POST", body: "{}", headers: JSON_CT });
    expect(res.status).toBe(500);
    expect(await res.text()).toBe("app error: handler broke");
  });
});

describe("requests answered before anything is claimed", () => {
  it("no key, an invalid key, or no authenticated caller: 4xx with the answer bound, reported invalid", async () => {
    const r = route();
    const missing = await r.send({});
    expect(missing.status).toBe(400);
    expect(missing.headers.get("idempotency-answer-within")).toBe("2");
    const invalid = await r.send({ key: '"unclosed' });
    expect(invalid.status).toBe(400);
    expect(((await invalid.json()) as { type: string }).type).toBe(
      "urn:idem:problem:idempotency-key-invalid",
    );
    const key = newKey();
    const anonymous = await r.send({ key, headers: { "x-anonymous": "1" } });
    expect(anonymous.status).toBe(401);
    expect(anonymous.headers.get("idempotency-answer-within")).toBe("2");
    expect(await anonymous.json()).toMatchObject({
      type: "urn:idem:problem:unauthorized",
      detail: "Authenticate before sending an idempotent request.",
    });
    expect(r.events).toEqual([
      { outcome: "invalid", status: 400, scope: SCOPE, key: undefined },
      { outcome: "invalid", status: 400, scope: SCOPE, key: undefined },
      { outcome: "invalid", status: 401, scope: undefined, key },
    ]);
    expect(r.runs()).toBe(0);
  });

  it("an anonymous request without a key on an optional route runs, unscoped", async () => {
    const r = route({ required: false });
    const res = await r.send({ headers: { "x-anonymous": "1" } });
    expect(res.status).toBe(201);
    expect(r.events).toEqual([{ outcome: "unkeyed", status: 201, scope: undefined }]);
  });

  it("a body over the route's limit: 413 problem+json with the answer bound, the handler never runs", async () => {
    const events: OutcomeEvent[] = [];
    let runs = 0;
    const handler = webIdempotency(
      async () => {
        runs++;
        return new Response("ran", { status: 201 });
      },
      { store, scope: () => SCOPE, limit: 8, onOutcome: (e) => events.push(e) },
    );
    const res = await handler(
      new Request("http://idem.test/w", {
        method: "POST",
        body: '{"amount":1000}',
        headers: { ...JSON_CT, "idempotency-key": newKey() },
      }),
      undefined,
    );
    expect(res.status).toBe(413);
    expect(res.headers.get("idempotency-answer-within")).toBe("2");
    expect(await res.json()).toMatchObject({
      type: "urn:idem:problem:body-too-large",
      operation_state: "none",
      safe_new_key: true,
    });
    expect(res.headers.get("idempotency-operation-state")).toBe("none");
    expect(runs).toBe(0);
  });

  it("the answer bound is the store's duplicate wait in whole seconds, at least one; 5 by default", async () => {
    const bound = async (lockTimeoutMs: number | undefined) =>
      (
        await route({ store: failingStore(() => new KeyMismatchError(), lockTimeoutMs) }).send({})
      ).headers.get("idempotency-answer-within");
    expect(await bound(undefined)).toBe("5");
    expect(await bound(0)).toBe("1");
    expect(await bound(1_000)).toBe("1");
    expect(await bound(1_001)).toBe("2");
  });
});

describe("failures a store reports", () => {
  async function answer(error: () => unknown) {
    const r = route({ store: failingStore(error) });
    const key = newKey();
    const res = await r.send({ key });
    const text = await res.text();
    return {
      status: res.status,
      retryAfter: res.headers.get("retry-after"),
      state: res.headers.get("idempotency-operation-state"),
      within: res.headers.get("idempotency-answer-within"),
      body: res.headers.get("content-type") === "application/problem+json" ? JSON.parse(text) : text,
      events: r.events,
      ref: refsOf(undefined).encode(SCOPE, key),
      key,
    };
  }

  it("another request holds the key: 409, retry the same key after Retry-After", async () => {
    const a = await answer(() => new KeyInFlightError(3));
    expect(a).toMatchObject({ status: 409, retryAfter: "3", state: "in_progress", within: "5" });
    expect(a.body).toMatchObject({ retry_same_key: true, safe_new_key: false, operation_ref: a.ref });
    expect(a.events).toEqual([{ outcome: "in_flight", status: 409, scope: SCOPE, key: a.key }]);
  });

  it("the key was used for another request: 422, reported as a mismatch", async () => {
    const a = await answer(() => new KeyMismatchError());
    expect(a).toMatchObject({ status: 422, retryAfter: null, state: "none" });
    expect(a.body.operation_ref).toBe(a.ref);
    expect(a.events.map((e) => e.outcome)).toEqual(["mismatch"]);
  });

  it("a lost lease and a retryable failure are reported retryable; an unknown outcome, uncertain", async () => {
    expect((await answer(() => new LeaseLostError())).events.map((e) => e.outcome)).toEqual(["retryable"]);
    const retry = await answer(() => new RetryableError("provider timeout", { retryAfterSeconds: 4 }));
    expect(retry).toMatchObject({ status: 503, retryAfter: "4", state: "none" });
    expect(retry.events.map((e) => [e.outcome, e.status])).toEqual([["retryable", 503]]);
    const uncertain = await answer(() => new OperationUncertainError("op_bank"));
    expect(uncertain).toMatchObject({ status: 409, state: "uncertain" });
    expect(uncertain.body.operation_ref).toBe("op_bank");
    expect(uncertain.events.map((e) => e.outcome)).toEqual(["uncertain"]);
  });

  it("another idem error is reported by its status: 409 in flight, 422 mismatch, else retryable", async () => {
    const outcome = async (status: number) =>
      (await answer(() => new IdemError("custom", status, "custom"))).events.map((e) => [
        e.outcome,
        e.status,
      ]);
    expect(await outcome(409)).toEqual([["in_flight", 409]]);
    expect(await outcome(422)).toEqual([["mismatch", 422]]);
    expect(await outcome(503)).toEqual([["retryable", 503]]);
  });

  it("no connection could be had: 503, nothing was done, a new key is safe", async () => {
    const a = await answer(() => socketError("ECONNREFUSED"));
    expect(a).toMatchObject({ status: 503, retryAfter: "1", state: "none", within: "5" });
    expect(a.body).toMatchObject({
      type: "urn:idem:problem:retryable-failure",
      detail: "The database is unavailable; nothing was done. Retry with the same key.",
      retry_same_key: true,
      safe_new_key: true,
    });
    expect(a.events.map((e) => [e.outcome, e.status])).toEqual([["retryable", 503]]);
  });

  it("the connection lost after the claim: 503, the key may stand, so only the same key is safe", async () => {
    const a = await answer(() => socketError("ECONNRESET"));
    expect(a).toMatchObject({ status: 503, retryAfter: "1", state: "in_progress" });
    expect(a.body).toMatchObject({ retry_same_key: true, safe_new_key: false, operation_ref: a.ref });
  });

  it("any other error is the application's to answer", async () => {
    const a = await answer(() => new TypeError("a bug"));
    expect(a.status).toBe(500);
    expect(a.body).toBe("app error: a bug");
    expect(a.events).toEqual([]);
  });
});

describe("a phases route", () => {
  const EXPIRES = new Date("2030-01-02T03:04:05Z");
  function phasesRoute(
    outcome: (claim: Claim) => AtomicOutcome | Promise<AtomicOutcome>,
    options: {
      answerWithinMs?: number;
      authorize?: () => boolean;
      existing?: boolean;
      inspectable?: boolean;
    } = {},
  ) {
    const calls: Array<{ claim: Claim; input: unknown; answerWithinMs: number | undefined }> = [];
    const events: OutcomeEvent[] = [];
    const runner: PhasesRunnerLike<unknown> = {
      store:
        options.inspectable === false
          ? undefined
          : { inspect: async () => (options.existing ? { key: "k" } : undefined) },
      async run(claim, input, opts) {
        calls.push({ claim, input, answerWithinMs: opts?.answerWithinMs });
        return outcome(claim);
      },
    };
    const app = new Hono<IdempotencyEnv>();
    app.onError((err, c) => c.text(`app error: ${err.message}`, 500));
    app.post(
      "/p",
      idempotentPhases({
        runner,
        scope: () => SCOPE,
        input: (_c, body) => ({ from: body }),
        onOutcome: (e) => events.push(e),
        ...(options.authorize ? { authorizeReplay: options.authorize } : {}),
        ...(options.answerWithinMs === undefined ? {} : { answerWithinMs: options.answerWithinMs }),
      }),
    );
    const send = (key?: string) =>
      Promise.resolve(
        app.request("http://idem.test/p", {
          method: "POST",
          body: '{"amount":1}',
          headers: { ...JSON_CT, ...(key ? { "idempotency-key": key } : {}) },
        }),
      );
    return { send, calls, events };
  }
  const reply = (status: number) => ({
    status,
    headers: [["content-type", "application/json"]] as Array<[string, string]>,
    body: new TextEncoder().encode(`{"status":${status}}`),
  });

  it("hands the runner the claim, the input and the answer bound, and publishes the bound", async () => {
    const p = phasesRoute(
      () => ({ kind: "executed", response: reply(201), saved: true, expiresAt: EXPIRES }),
      {
        answerWithinMs: 2_500,
      },
    );
    const res = await p.send("ph-1");
    expect(res.status).toBe(201);
    expect(res.headers.get("idempotency-answer-within")).toBe("3");
    expect(res.headers.get("idempotency-expires")).toBe(EXPIRES.toUTCString());
    expect(p.calls).toHaveLength(1);
    expect(p.calls[0]).toMatchObject({
      claim: { scope: SCOPE, key: "ph-1" },
      input: { from: { amount: 1 } },
      answerWithinMs: 2_500,
    });
    const byDefault = phasesRoute(() => ({
      kind: "executed",
      response: reply(201),
      saved: false,
      expiresAt: EXPIRES,
    }));
    const res2 = await byDefault.send("ph-2");
    expect(res2.headers.get("idempotency-answer-within")).toBe("5");
    expect(res2.headers.get("idempotency-expires")).toBeNull();
    expect(byDefault.calls[0]!.answerWithinMs).toBe(5_000);
    expect(byDefault.events.map((e) => e.outcome)).toEqual(["not_saved"]);
  });

  it("requires a key", async () => {
    const p = phasesRoute(() => ({
      kind: "executed",
      response: reply(201),
      saved: true,
      expiresAt: EXPIRES,
    }));
    const res = await p.send();
    expect(res.status).toBe(400);
    expect(p.calls).toHaveLength(0);
  });

  it("a replay carries the runner's expiry, and a saved decline says nothing was applied", async () => {
    const p = phasesRoute(() => ({ kind: "replayed", response: reply(402), expiresAt: EXPIRES }));
    const res = await p.send("ph-3");
    expect(res.status).toBe(402);
    expect(res.headers.get("idempotent-replayed")).toBe("true");
    expect(res.headers.get("idempotency-expires")).toBe(EXPIRES.toUTCString());
    expect(res.headers.get("idempotency-operation-state")).toBe("failed_not_applied");
  });

  it("does not resume or replay a key for a caller who may no longer see it", async () => {
    const done = () => ({ kind: "replayed" as const, response: reply(201), expiresAt: EXPIRES });
    const existing = phasesRoute(done, { authorize: () => false, existing: true });
    const refused = await existing.send("ph-4");
    expect(refused.status).toBe(401);
    expect(existing.calls).toHaveLength(0);
    expect(existing.events.map((e) => [e.outcome, e.status])).toEqual([["invalid", 401]]);
    const fresh = phasesRoute(
      () => ({ kind: "executed", response: reply(201), saved: true, expiresAt: EXPIRES }),
      { authorize: () => false, existing: false },
    );
    expect((await fresh.send("ph-5")).status).toBe(201);
    const allowed = phasesRoute(done, { authorize: () => true, existing: true });
    expect((await allowed.send("ph-6")).status).toBe(201);
    // A runner whose store cannot look keys up: the saved answer is still not replayed to them.
    const blind = phasesRoute(done, { authorize: () => false, inspectable: false });
    expect((await blind.send("ph-7")).status).toBe(401);
    expect(blind.calls).toHaveLength(1);
  });

  it("a failure after the claim leaves the key in progress: only the same key is safe", async () => {
    for (const error of [socketError("ECONNREFUSED"), new RetryableError("provider 5xx")]) {
      const p = phasesRoute(() => {
        throw error;
      });
      const res = await p.send("ph-8");
      expect(res.status).toBe(503);
      expect(res.headers.get("idempotency-answer-within")).toBe("5");
      expect(await res.json()).toMatchObject({
        operation_state: "in_progress",
        retry_same_key: true,
        safe_new_key: false,
        operation_ref: refsOf(undefined).encode(SCOPE, "ph-8"),
      });
    }
    const bug = phasesRoute(() => {
      throw new TypeError("runner bug");
    });
    expect(await (await bug.send("ph-9")).text()).toBe("app error: runner bug");
  });
});
