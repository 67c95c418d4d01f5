/**
 * What every HTTP adapter must do (the one lifecycle in src/core/lifecycle.ts, seen through each
 * framework), driven over real HTTP against a tiny payments app that each framework's test builds the
 * same way:
 *
 *   POST /v1/payments  key required, atomic mode, `authorizeReplay` refuses callers sending `x-revoked`
 *   POST /v1/tips      key optional, atomic mode
 *   POST /v1/phased    phases mode (`phasesRunner` below)
 *
 * The scope comes from `x-account` (standing in for authentication); the body is validated before the
 * idempotency middleware, and the handler acts on the body idem read (`idempotency.body`). Headers
 * outside the fingerprint steer the handler: `x-crash` makes it throw after its insert, `x-sleep-ms`
 * wait after its insert, `x-status` return that status after its insert.
 */
import { randomBytes, randomUUID } from "node:crypto";
import { connect, createServer, type Server, type Socket } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import { afterAll, beforeAll, expect, it } from "vitest";
import { fromPg } from "../../src/postgres/drivers/pg.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import type { OpenDb, TestBackend } from "../helpers/db.ts";
import { type PaymentsRunner, phasesRunner } from "./contract-app.ts";

export * from "./contract-app.ts";

export interface RunningApp {
  url: string;
  close(): Promise<void>;
}

/** Everything an app under test is built from: the store, and the phases runner of `/v1/phased`. */
export interface AppParts {
  store: PostgresStore;
  runner: PaymentsRunner;
  /** The URL the store reaches its database by (real server only): for apps run in another process. */
  url?: string;
}

export type StartApp = (parts: AppParts) => Promise<RunningApp>;

export interface AppUnderTest {
  readonly url: string;
  readonly db: OpenDb["db"];
  readonly store: PostgresStore;
  /** Payment rows of an account. */
  rows(account: string): Promise<number>;
  /** Key rows of an account (saved or in flight). */
  keys(account: string): Promise<number>;
  /** Which database the app runs on (PGlite has one connection: no request waits beside another). */
  readonly backend: TestBackend["name"];
  /** The same app on a store whose database can be switched off (real server only, else undefined). */
  readonly down: DownApp | undefined;
  post(
    path: string,
    init: {
      account?: string;
      key?: string;
      body?: unknown;
      headers?: Record<string, string>;
      signal?: AbortSignal;
    },
  ): Promise<Response>;
}

/** A second instance of the app whose store reaches PostgreSQL through a proxy that can refuse it. */
export interface DownApp {
  url: string;
  /** Cut every connection and refuse new ones (true), or let them through again (false). */
  setDown(down: boolean): void;
}

/** A TCP proxy to PostgreSQL: up, it pipes; down, it destroys every socket (the database is unreachable). */
async function startDbProxy(
  target: URL,
): Promise<{ port: number; setDown(d: boolean): void; close(): void }> {
  let down = false;
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    if (down) return client.destroy();
    const upstream = connect(Number(target.port || 5432), target.hostname);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("close", () => sockets.delete(s));
      s.on("error", () => {});
    }
    client.pipe(upstream).pipe(client);
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: (server.address() as { port: number }).port,
    setDown(d) {
      down = d;
      if (d) for (const s of sockets) s.destroy();
    },
    close() {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

/** Open a fresh database, migrate it, start the app on 127.0.0.1:0; stop both after the file. */
export function useApp(backend: TestBackend, start: StartApp): AppUnderTest {
  let open: OpenDb;
  let store: PostgresStore;
  let app: RunningApp;
  let down: (DownApp & { close(): Promise<void> }) | undefined;
  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
    await open.db.exec(
      `CREATE TABLE payments (id serial PRIMARY KEY, account text NOT NULL,
                              amount_cents integer NOT NULL, currency text NOT NULL);
       CREATE TABLE external_calls (key text PRIMARY KEY, amount_cents integer NOT NULL)`,
    );
    // A short duplicate wait, so that the in-flight case answers 409 quickly (published as 1 s).
    store = await PostgresStore.open(open.db, { lockTimeoutMs: 1_000 });
    app = await start({ store, runner: phasesRunner(store), url: open.url });
    if (open.url) down = await startDown(new URL(open.url), start);
  }, 60_000);
  afterAll(async () => {
    await down?.close();
    await app?.close();
    await open?.close();
  });
  const count = async (sql: string, account: string) =>
    (await open.db.query<{ n: number }>(sql, [account])).rows[0]!.n;
  return {
    get url() {
      return app.url;
    },
    get db() {
      return open.db;
    },
    get store() {
      return store;
    },
    get down() {
      return down;
    },
    backend: backend.name,
    rows: (account) => count("SELECT count(*)::int AS n FROM payments WHERE account = $1", account),
    keys: (account) => count("SELECT count(*)::int AS n FROM idem.keys WHERE scope = $1", account),
    post: (path, init) => postTo(app.url, path, init),
  };
}

export type PostInit = Parameters<AppUnderTest["post"]>[1];

/** POST a JSON body (default: a valid payment) with the test's account and key headers. */
export function postTo(base: string, path: string, init: PostInit): Promise<Response> {
  const headers: Record<string, string> = { "content-type": "application/json", ...init.headers };
  if (init.account !== undefined) headers["x-account"] = init.account;
  if (init.key !== undefined) headers["idempotency-key"] = init.key;
  return fetch(base + path, {
    method: "POST",
    headers,
    signal: init.signal,
    body:
      typeof init.body === "string"
        ? init.body
        : JSON.stringify(init.body ?? { amount_cents: 5000, currency: "eur" }),
  });
}

/** The app again, on a pool that reaches the database through a proxy the test can switch off. */
async function startDown(url: URL, start: StartApp): Promise<DownApp & { close(): Promise<void> }> {
  const proxy = await startDbProxy(url);
  const proxied = new URL(url);
  proxied.host = `127.0.0.1:${proxy.port}`;
  const pool = new pg.Pool({ connectionString: proxied.toString(), max: 4, connectionTimeoutMillis: 2_000 });
  pool.on("error", () => {}); // the proxy cuts idle connections on purpose
  const store = await PostgresStore.open(fromPg(pool), { lockTimeoutMs: 1_000 });
  const app = await start({ store, runner: phasesRunner(store), url: proxied.toString() });
  return {
    url: app.url,
    setDown: proxy.setDown,
    async close() {
      await app.close();
      proxy.close();
      await pool.end().catch(() => {});
    },
  };
}

export const account = () => `acct_${randomBytes(6).toString("hex")}`;

export const PROBLEM = "urn:idem:problem:";

export async function problemOf(
  res: Response,
): Promise<{ type: string; status: number; [field: string]: unknown }> {
  expect(res.headers.get("content-type")).toBe("application/problem+json");
  return (await res.json()) as { type: string; status: number };
}

/** The behaviours every adapter shares. */
export function paymentsContract(app: AppUnderTest, options: { hangUp?: boolean } = {}): void {
  it("runs a new key once and replays the same bytes with Idempotent-Replayed: true", async () => {
    const acct = account();
    const key = randomUUID();
    const first = await app.post("/v1/payments", { account: acct, key });
    const firstBody = await first.text();
    expect(first.status).toBe(201);
    expect(first.headers.get("idempotent-replayed")).toBeNull();
    const retry = await app.post("/v1/payments", { account: acct, key });
    expect(retry.status).toBe(201);
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(retry.headers.get("content-type")).toBe(first.headers.get("content-type"));
    expect(retry.headers.get("location")).toBe(first.headers.get("location"));
    expect(await retry.text()).toBe(firstBody);
    expect(await app.rows(acct)).toBe(1);
    // Both name the same operation, this claim of the key (GET /v1/operations/{ref}).
    const ref = first.headers.get("idempotency-operation-ref");
    expect(app.store.refs.decode(ref ?? "")).toMatchObject({ key, claimId: expect.any(String) });
    expect(retry.headers.get("idempotency-operation-ref")).toBe(ref);
  });

  it("sends Set-Cookie to the first caller and never in a replay", async () => {
    const acct = account();
    const key = randomUUID();
    const first = await app.post("/v1/payments", { account: acct, key });
    expect(first.headers.getSetCookie()).toEqual([
      expect.stringMatching(/^session=[0-9a-f]{16}; Path=\/; HttpOnly$/),
    ]);
    const retry = await app.post("/v1/payments", { account: acct, key });
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(retry.headers.getSetCookie()).toEqual([]);
  });

  it("answers the same key with another body 422 problem+json and runs nothing", async () => {
    const acct = account();
    const key = randomUUID();
    await app.post("/v1/payments", { account: acct, key, body: { amount_cents: 5000, currency: "eur" } });
    const other = await app.post("/v1/payments", {
      account: acct,
      key,
      body: { amount_cents: 9999, currency: "eur" },
    });
    expect(other.status).toBe(422);
    expect(await problemOf(other)).toMatchObject({ type: `${PROBLEM}idempotency-key-mismatch`, status: 422 });
    expect(await app.rows(acct)).toBe(1);
  });

  it("treats JSON with reordered fields as the same request", async () => {
    const acct = account();
    const key = randomUUID();
    await app.post("/v1/payments", { account: acct, key, body: '{"amount_cents":5000,"currency":"eur"}' });
    const retry = await app.post("/v1/payments", {
      account: acct,
      key,
      body: '{ "currency": "eur", "amount_cents": 5000 }',
    });
    expect(retry.status).toBe(201);
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
  });

  it("answers a missing key 400 problem+json and saves nothing", async () => {
    const acct = account();
    const res = await app.post("/v1/payments", { account: acct });
    expect(res.status).toBe(400);
    expect(await problemOf(res)).toMatchObject({ type: `${PROBLEM}idempotency-key-missing` });
    expect(await app.rows(acct)).toBe(0);
    expect(await app.keys(acct)).toBe(0);
  });

  it.each([
    ["300 characters", "k".repeat(300)],
    ["a control character (tab)", "abc\tdef"],
    ["an unterminated quoted key", '"abc'],
  ])("answers a key of %s 400 problem+json and saves nothing", async (_, key) => {
    const acct = account();
    const res = await app.post("/v1/payments", { account: acct, key });
    expect(res.status).toBe(400);
    expect(await problemOf(res)).toMatchObject({ type: `${PROBLEM}idempotency-key-invalid` });
    expect(await app.rows(acct)).toBe(0);
    expect(await app.keys(acct)).toBe(0);
  });

  it("accepts the quoted sf-string key as the same key as the bare token", async () => {
    const acct = account();
    const key = `abc-${randomUUID()}`;
    const quoted = await app.post("/v1/payments", { account: acct, key: `"${key}"` });
    expect(quoted.status).toBe(201);
    const bare = await app.post("/v1/payments", { account: acct, key });
    expect(bare.headers.get("idempotent-replayed")).toBe("true");
    expect(await bare.text()).toBe(await quoted.text());
    expect(await app.rows(acct)).toBe(1);
  });

  it("answers an invalid body 400 before claiming, so the key stays free", async () => {
    const acct = account();
    const key = randomUUID();
    const bad = await app.post("/v1/payments", {
      account: acct,
      key,
      body: { amount_cents: -1, currency: "eur" },
    });
    expect(bad.status).toBe(400);
    expect(await app.keys(acct)).toBe(0);
    const good = await app.post("/v1/payments", { account: acct, key });
    expect(good.status).toBe(201);
    expect(good.headers.get("idempotent-replayed")).toBeNull();
  });

  it("runs ten concurrent requests with one key once, and all of them get the same body", async () => {
    const acct = account();
    const key = randomUUID();
    const replies = await Promise.all(
      Array.from({ length: 10 }, async () => {
        const res = await app.post("/v1/payments", { account: acct, key });
        return { status: res.status, body: await res.text() };
      }),
    );
    expect(replies.map((r) => r.status)).toEqual(Array(10).fill(201));
    expect(new Set(replies.map((r) => r.body)).size).toBe(1);
    expect(await app.rows(acct)).toBe(1);
  });

  it("keeps scopes apart: the same key runs once in each account", async () => {
    const [a, b] = [account(), account()];
    const key = randomUUID();
    const ra = await app.post("/v1/payments", { account: a, key });
    const rb = await app.post("/v1/payments", { account: b, key });
    expect([ra.status, rb.status]).toEqual([201, 201]);
    expect(rb.headers.get("idempotent-replayed")).toBeNull();
    expect((await rb.json()).account).toBe(b);
    expect([await app.rows(a), await app.rows(b)]).toEqual([1, 1]);
  });

  it("rolls back a handler that throws: 500, nothing saved, and the retry runs", async () => {
    const acct = account();
    const key = randomUUID();
    const crash = await app.post("/v1/payments", { account: acct, key, headers: { "x-crash": "1" } });
    expect(crash.status).toBe(500);
    expect(await app.rows(acct)).toBe(0);
    expect(await app.keys(acct)).toBe(0);
    const retry = await app.post("/v1/payments", { account: acct, key });
    expect(retry.status).toBe(201);
    expect(retry.headers.get("idempotent-replayed")).toBeNull();
    expect(await app.rows(acct)).toBe(1);
  });

  it("runs a request without a key on an optional-key route every time, and replays one with a key", async () => {
    const acct = account();
    const one = await app.post("/v1/tips", { account: acct });
    const two = await app.post("/v1/tips", { account: acct });
    expect([one.status, two.status]).toEqual([201, 201]);
    expect(two.headers.get("idempotent-replayed")).toBeNull();
    expect(await app.rows(acct)).toBe(2);
    const key = randomUUID();
    await app.post("/v1/tips", { account: acct, key });
    const replay = await app.post("/v1/tips", { account: acct, key });
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(await app.rows(acct)).toBe(3);
  });

  it("answers a keyed request without a scope 401 problem+json", async () => {
    const res = await app.post("/v1/payments", { key: randomUUID() });
    expect(res.status).toBe(401);
    expect(await problemOf(res)).toMatchObject({ type: `${PROBLEM}unauthorized` });
  });

  if (options.hangUp) {
    it("saves nothing for a client that hangs up before the commit, and its retry runs", async () => {
      const acct = account();
      const key = randomUUID();
      const attempt = app.post("/v1/payments", {
        account: acct,
        key,
        headers: { "x-sleep-ms": "300" },
        signal: AbortSignal.timeout(50),
      });
      await expect(attempt).rejects.toThrow();
      await sleep(700); // the handler finishes its 300 ms, then the store sees the hang-up and rolls back
      expect(await app.rows(acct)).toBe(0);
      expect(await app.keys(acct)).toBe(0);
      const retry = await app.post("/v1/payments", { account: acct, key });
      expect(retry.status).toBe(201);
      expect(retry.headers.get("idempotent-replayed")).toBeNull();
      expect(await app.rows(acct)).toBe(1);
    });
  }
}
