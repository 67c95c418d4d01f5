/**
 * `effectsInTxOnly` over real HTTP, for every adapter: the handler's first statement leaves with the
 * key's claim (pg with `pipeline: true`), and must roll back whenever the key turns out to be taken,
 * while the client still gets the key's own answer (a replay, 409 or 422), never the 500 of the
 * handler's `AbandonedWorkError`. Each adapter runs as two instances (two stores, two pools: two
 * processes) on one database. PGlite runs the same cases without speculation (it cannot pipeline).
 */
import { randomBytes, randomUUID } from "node:crypto";
import {
  Agent,
  createServer,
  request as httpRequest,
  type IncomingMessage,
  type ServerResponse,
} from "node:http";
import type { AddressInfo } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { serve } from "@hono/node-server";
import express, { type Request as ExRequest, type Response as ExResponse, type NextFunction } from "express";
import Fastify, { type FastifyRequest } from "fastify";
import { type Context, Hono } from "hono";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AbandonedWorkError, type Tx } from "../../src/core/index.ts";
import * as idemExpress from "../../src/http/express.ts";
import * as idemFastify from "../../src/http/fastify.ts";
import * as idemHono from "../../src/http/hono.ts";
import * as idemNode from "../../src/http/node.ts";
import * as idemWeb from "../../src/http/web.ts";
import type { Db } from "../../src/postgres/db.ts";
import { fromPg } from "../../src/postgres/drivers/pg.ts";
import { fromPglite } from "../../src/postgres/drivers/pglite.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { DATABASE_URL, freshDatabase, newPglite } from "../helpers/db.ts";
import { account, type PostInit, PROBLEM, postTo, problemOf, type RunningApp } from "./contract.ts";

/** What one instance counts: how often its handler was told its work was abandoned. */
interface Seen {
  abandoned: number;
}

interface PaymentBody {
  amount_cents: number;
  currency: string;
}

/**
 * The handler's work: one INSERT (two on `/v1/two`, the second after the first), answered 201 with the
 * row. `x-sleep-ms` holds the transaction after the inserts; `x-crash` then throws.
 */
async function pay(
  tx: Tx,
  seen: Seen,
  path: string,
  scope: string | undefined,
  body: unknown,
  header: (name: string) => string | undefined,
): Promise<string> {
  const { amount_cents, currency } = body as PaymentBody;
  try {
    const insert =
      "INSERT INTO payments (account, amount_cents, currency, note) VALUES ($1, $2, $3, $4) RETURNING *";
    const first = (await tx.query(insert, [scope, amount_cents, currency, "first"])).rows[0];
    const second = path.endsWith("/two")
      ? (await tx.query(insert, [scope, amount_cents, currency, "second"])).rows[0]
      : undefined;
    const wait = Number(header("x-sleep-ms") ?? 0);
    if (wait > 0) await sleep(wait);
    if (header("x-crash")) throw new Error("the handler crashed after its inserts");
    return JSON.stringify({ first, second, receipt: randomBytes(8).toString("hex") });
  } catch (err) {
    if (err instanceof AbandonedWorkError) seen.abandoned++;
    throw err;
  }
}

const ROUTES = ["/v1/payments", "/v1/two"];

type Start = (store: PostgresStore, seen: Seen) => Promise<RunningApp>;

function closer(server: { close(cb: () => void): void; closeAllConnections?(): void }) {
  return () =>
    new Promise<void>((done) => {
      server.close(() => done());
      server.closeAllConnections?.();
    });
}

const startExpress: Start = async (store, seen) => {
  const app = express();
  const json = express.json({ verify: idemExpress.keepRawBody });
  const idem = idemExpress.idempotency({
    store,
    scope: (req) => req.get("x-account"),
    effectsInTxOnly: true,
  });
  for (const path of ROUTES) {
    app.post(path, json, idem, async (req: ExRequest, res: ExResponse) => {
      const { tx, scope, body } = req.idempotency;
      res
        .status(201)
        .type("application/json")
        .send(await pay(tx, seen, path, scope, body, (n) => req.get(n)));
    });
  }
  app.use((_err: unknown, _req: ExRequest, res: ExResponse, _next: NextFunction) => {
    res.status(500).json({ type: "urn:test:crash" });
  });
  const server = app.listen(0, "127.0.0.1");
  await new Promise((r) => server.once("listening", r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, close: closer(server) };
};

const startHono: Start = async (store, seen) => {
  const app = new Hono();
  const idem = idemHono.idempotency({
    store,
    scope: (c) => c.req.header("x-account"),
    effectsInTxOnly: true,
  });
  for (const path of ROUTES) {
    app.post(path, idem, async (c: Context<idemHono.IdempotencyEnv>) => {
      const { tx, scope, body } = c.var.idempotency;
      const json = await pay(tx, seen, path, scope, body, (n) => c.req.header(n));
      return c.body(json, 201, { "content-type": "application/json" });
    });
  }
  app.onError((_err, c) => c.json({ type: "urn:test:crash" }, 500));
  return new Promise((resolve) => {
    const server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, (info: AddressInfo) =>
      resolve({
        url: `http://127.0.0.1:${info.port}`,
        close: closer(server as unknown as import("node:http").Server),
      }),
    );
  });
};

const startFastify: Start = async (store, seen) => {
  const app = Fastify();
  const hooks = idemFastify.idempotency({
    store,
    scope: (request: FastifyRequest) => request.headers["x-account"] as string | undefined,
    effectsInTxOnly: true,
  });
  for (const path of ROUTES) {
    app.post(path, { ...hooks }, async (request, reply) => {
      const { tx, scope, body } = request.idempotency;
      const header = (n: string) => request.headers[n] as string | undefined;
      return reply
        .code(201)
        .type("application/json")
        .send(await pay(tx, seen, path, scope, body, header));
    });
  }
  app.setErrorHandler((_err, _request, reply) => reply.code(500).send({ type: "urn:test:crash" }));
  const url = await app.listen({ port: 0, host: "127.0.0.1" });
  return { url, close: () => app.close() };
};

const startNode: Start = async (store, seen) => {
  const routes: Record<string, (req: IncomingMessage, res: ServerResponse) => void> = {};
  for (const path of ROUTES) {
    routes[path] = idemNode.idempotency(
      async (req, { tx, scope, body }) => ({
        status: 201,
        headers: { "content-type": "application/json" },
        body: await pay(tx, seen, path, scope, body, (n) => req.headers[n] as string | undefined),
      }),
      {
        store,
        scope: (req) => req.headers["x-account"] as string | undefined,
        effectsInTxOnly: true,
        onError: () => {},
      },
    );
  }
  const server = createServer((req, res) => {
    const route = routes[req.url ?? ""];
    if (route) return route(req, res);
    res.statusCode = 404;
    res.end();
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, close: closer(server) };
};

const startWeb: Start = async (store, seen) => {
  const routes: Record<string, (request: Request, context: unknown) => Promise<Response>> = {};
  for (const path of ROUTES) {
    routes[path] = idemWeb.idempotency(
      async (request, { tx, scope, body }) =>
        new Response(await pay(tx, seen, path, scope, body, (n) => request.headers.get(n) ?? undefined), {
          status: 201,
          headers: { "content-type": "application/json" },
        }),
      {
        store,
        scope: (request) => request.headers.get("x-account") ?? undefined,
        effectsInTxOnly: true,
        onError: () => {},
      },
    );
  }
  return new Promise((resolve) => {
    const server = serve(
      {
        fetch: (request: Request) => {
          const route = routes[new URL(request.url).pathname];
          return route ? route(request, {}) : new Response(null, { status: 404 });
        },
        port: 0,
        hostname: "127.0.0.1",
      },
      (info: AddressInfo) =>
        resolve({
          url: `http://127.0.0.1:${info.port}`,
          close: closer(server as unknown as import("node:http").Server),
        }),
    );
  });
};

/** Each adapter, and the type of its answer to a handler that threw (the app's, or idem's own). */
const adapters: Array<{ name: string; start: Start; crash: string }> = [
  { name: "express", start: startExpress, crash: "urn:test:crash" },
  { name: "hono", start: startHono, crash: "urn:test:crash" },
  { name: "fastify", start: startFastify, crash: "urn:test:crash" },
  { name: "node", start: startNode, crash: `${PROBLEM}internal-error` },
  { name: "web", start: startWeb, crash: `${PROBLEM}internal-error` },
];

/** One database and the two processes' connections to it. */
interface Backend {
  name: "pg" | "pglite";
  open(): Promise<{ dbs: [Db, Db]; close(): Promise<void> }>;
}

const pgPipelined: Backend = {
  name: "pg",
  async open() {
    const fresh = await freshDatabase("spec_http");
    const pools = [0, 1].map(() => {
      const pool = new pg.Pool({ connectionString: fresh.url, max: 10, pipeline: true } as pg.PoolConfig);
      pool.on("error", () => {});
      return pool;
    });
    const dbs = pools.map((pool) => fromPg(pool, { owned: true })) as [Db, Db];
    return {
      dbs,
      async close() {
        await Promise.all(dbs.map((db) => db.close()));
        await fresh.drop();
      },
    };
  },
};

const pglite: Backend = {
  name: "pglite",
  async open() {
    const db = fromPglite(await newPglite());
    return { dbs: [db, db], close: () => db.close() };
  },
};

interface Instance {
  url: string;
  seen: Seen;
  post(path: string, init: PostInit): Promise<Response>;
}

/** POST over a keep-alive agent (one socket), saying whether the request reused the previous socket. */
function postKeepAlive(
  agent: Agent,
  base: string,
  path: string,
  init: PostInit,
): Promise<{ status: number; headers: IncomingMessage["headers"]; body: string; reused: boolean }> {
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (init.account) headers["x-account"] = init.account;
  if (init.key) headers["idempotency-key"] = init.key;
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${base}${path}`, { method: "POST", agent, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () =>
        resolve({
          status: res.statusCode ?? 0,
          headers: res.headers,
          body: Buffer.concat(chunks).toString(),
          reused: req.reusedSocket,
        }),
      );
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(JSON.stringify(init.body ?? { amount_cents: 5000, currency: "eur" }));
  });
}

/** The cases, for every adapter, on one backend. */
function cases(backend: Backend): void {
  describe.each(adapters)("$name, two instances", ({ start, crash }) => {
    let closeDb: () => Promise<void>;
    let db: Db;
    let apps: RunningApp[] = [];
    let a: Instance;
    let b: Instance;
    beforeAll(async () => {
      const opened = await backend.open();
      closeDb = opened.close;
      db = opened.dbs[0];
      await migrate(db);
      await db.exec(
        `CREATE TABLE payments (id serial PRIMARY KEY, account text NOT NULL, amount_cents integer NOT NULL,
                                currency text NOT NULL, note text NOT NULL)`,
      );
      const instances: Instance[] = [];
      for (const d of opened.dbs) {
        const store = await PostgresStore.open(d, { lockTimeoutMs: 1_000 });
        const seen = { abandoned: 0 };
        const app = await start(store, seen);
        apps.push(app);
        instances.push({ url: app.url, seen, post: (path, init) => postTo(app.url, path, init) });
      }
      [a, b] = instances as [Instance, Instance];
    }, 60_000);
    afterAll(async () => {
      await Promise.all(apps.map((app) => app.close()));
      apps = [];
      await closeDb?.();
    });

    const rows = async (acct: string) =>
      (await db.query<{ n: number }>("SELECT count(*)::int AS n FROM payments WHERE account = $1", [acct]))
        .rows[0]!.n;
    /** On the pipelining driver the other instance started the handler before its lookup answered. */
    const speculated = backend.name === "pg";

    it("runs a key once; the other instance replays the same bytes and rolls its insert back", async () => {
      const acct = account();
      const key = randomUUID();
      const first = await a.post("/v1/payments", { account: acct, key });
      const firstBody = await first.text();
      expect(first.status).toBe(201);
      expect(first.headers.get("idempotent-replayed")).toBeNull();
      expect(JSON.parse(firstBody).first).toMatchObject({ account: acct, amount_cents: 5000, note: "first" });

      const before = b.seen.abandoned;
      const retry = await b.post("/v1/payments", { account: acct, key });
      expect(retry.status).toBe(201);
      expect(retry.headers.get("idempotent-replayed")).toBe("true");
      expect(retry.headers.get("content-type")).toBe(first.headers.get("content-type"));
      expect(await retry.text()).toBe(firstBody);
      expect(await rows(acct)).toBe(1);
      expect(b.seen.abandoned - before).toBe(speculated ? 1 : 0);
    });

    it("answers the same key with another body 422 problem+json on the other instance, no new row", async () => {
      const acct = account();
      const key = randomUUID();
      expect((await a.post("/v1/payments", { account: acct, key })).status).toBe(201);
      const other = await b.post("/v1/payments", {
        account: acct,
        key,
        body: { amount_cents: 9999, currency: "eur" },
      });
      expect(other.status).toBe(422);
      expect(await problemOf(other)).toMatchObject({
        type: `${PROBLEM}idempotency-key-mismatch`,
        status: 422,
      });
      expect(await rows(acct)).toBe(1);
    });

    it("runs 30 concurrent requests with one key, split across both instances, once", async () => {
      const acct = account();
      const key = randomUUID();
      const replies = await Promise.all(
        Array.from({ length: 30 }, async (_, i) => {
          const res = await (i % 2 ? a : b).post("/v1/payments", { account: acct, key });
          const body = await res.text();
          return { status: res.status, type: res.status === 409 ? JSON.parse(body).type : undefined, body };
        }),
      );
      for (const r of replies) {
        if (r.status === 409) expect(r.type).toBe(`${PROBLEM}idempotency-key-in-flight`);
        else expect(r.status, r.body).toBe(201);
      }
      const created = replies.filter((r) => r.status === 201);
      expect(created.length).toBeGreaterThan(0);
      expect(new Set(created.map((r) => r.body)).size).toBe(1);
      expect(await rows(acct)).toBe(1);
    });

    it("replays a two-statement handler's key taken by the other instance, keeps neither statement, keeps the connection", async () => {
      const acct = account();
      const key = randomUUID();
      const first = await a.post("/v1/two", { account: acct, key });
      const firstBody = await first.text();
      expect(first.status).toBe(201);
      expect(await rows(acct)).toBe(2);

      const agent = new Agent({ keepAlive: true, maxSockets: 1 });
      try {
        const retry = await postKeepAlive(agent, b.url, "/v1/two", { account: acct, key });
        expect(retry.status, retry.body).toBe(201);
        expect(retry.headers["idempotent-replayed"]).toBe("true");
        expect(retry.body).toBe(firstBody);
        await sleep(50); // anything the abandoned handler might still write would have arrived by now
        expect(await rows(acct)).toBe(2);
        // The same connection still serves the next request.
        const next = await postKeepAlive(agent, b.url, "/v1/payments", { account: acct, key: randomUUID() });
        expect(next.status, next.body).toBe(201);
        expect(next.reused).toBe(true);
        expect(await rows(acct)).toBe(3);
      } finally {
        agent.destroy();
      }
    });

    it("answers a duplicate that waited for the other instance's holder with the holder's answer", async () => {
      const acct = account();
      const key = randomUUID();
      const holder = a.post("/v1/two", { account: acct, key, headers: { "x-sleep-ms": "200" } });
      await sleep(50); // a holds the key's lock now
      const waiter = await b.post("/v1/two", { account: acct, key });
      const held = await holder;
      const heldBody = await held.text();
      expect(held.status).toBe(201);
      expect(waiter.status).toBe(201);
      expect(waiter.headers.get("idempotent-replayed")).toBe("true");
      expect(await waiter.text()).toBe(heldBody);
      expect(await rows(acct)).toBe(2);
    });

    it("runs the handler of a duplicate whose holder on the other instance crashed", async () => {
      const acct = account();
      const key = randomUUID();
      const holder = a.post("/v1/two", {
        account: acct,
        key,
        headers: { "x-sleep-ms": "200", "x-crash": "1" },
      });
      await sleep(50); // a holds the key's lock now, and will roll back
      const waiter = await b.post("/v1/two", { account: acct, key });
      const crashed = await holder;
      expect(crashed.status).toBe(500);
      expect(await crashed.json()).toMatchObject({ type: crash }); // the app's error handling answered
      const body = await waiter.text();
      expect(waiter.status, body).toBe(201);
      expect(waiter.headers.get("idempotent-replayed")).toBeNull();
      expect(await rows(acct)).toBe(2);
    });
  });
}

describe.skipIf(!DATABASE_URL)("effectsInTxOnly over HTTP on PostgreSQL (pg, pipeline: true)", () =>
  cases(pgPipelined),
);

describe("effectsInTxOnly over HTTP on PGlite (no pipelining: runs as without it)", () => cases(pglite));
