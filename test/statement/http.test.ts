/**
 * Single-statement mode behind the adapters: `idempotency()` on node:http and Hono, with a
 * `SingleStatementStore` and a handler that answers `statement(tx, ...)`. The answers are the other
 * modes' (201 then a replay with Idempotent-Replayed, 422, 400 before any claim), from one statement.
 */
import { createServer, type IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import express from "express";
import Fastify from "fastify";
import { Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { idempotency as expressIdempotency } from "../../src/http/express.ts";
import { idempotency as fastifyIdempotency } from "../../src/http/fastify.ts";
import { idempotency as honoIdempotency } from "../../src/http/hono.ts";
import { idempotency } from "../../src/http/node.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { SingleStatementStore, type StatementSpec, statement } from "../../src/postgres/statement/store.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { backends, type OpenDb } from "../helpers/db.ts";

interface Payment {
  amount_cents: number;
  currency: string;
}

const spec = (scope: string | undefined, p: Payment): StatementSpec => ({
  sql: `INSERT INTO payments (account, amount_cents, currency, claim_id)
        SELECT $1, $2, $3, claim_id FROM idem_claim
        RETURNING id, amount_cents, currency`,
  params: [scope ?? null, p.amount_cents, p.currency],
  body: "json_build_object('id', id, 'amount_cents', amount_cents, 'currency', currency)::text",
  status: 201,
  headers: { "content-type": "application/json", "x-not-replayed": "1" },
});

const invalid = (p: unknown): boolean =>
  typeof (p as Payment)?.amount_cents !== "number" || typeof (p as Payment)?.currency !== "string";

function listen(server: ReturnType<typeof createServer>): Promise<string> {
  return new Promise((resolve) => {
    server.listen(0, "127.0.0.1", () =>
      resolve(`http://127.0.0.1:${(server.address() as AddressInfo).port}`),
    );
  });
}

describe.each(backends)("single-statement routes on $name", (backend) => {
  let open: OpenDb;
  let node: string;
  let hono: string;
  let exp: string;
  let fst: string;
  const closers: Array<() => void> = [];

  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
    await open.db.exec(
      "CREATE TABLE payments (id serial PRIMARY KEY, account text, amount_cents int NOT NULL, currency text NOT NULL, claim_id uuid)",
    );
    const store = new SingleStatementStore(await PostgresStore.open(open.db));
    const scope = (req: IncomingMessage) => req.headers["x-account"] as string | undefined;
    const keyed = idempotency(
      async (_req, { tx, scope, body }) => {
        if (invalid(body)) return { status: 400, body: "invalid payment" };
        return statement(tx, spec(scope, body as Payment));
      },
      { store, scope, onError: () => {} },
    );
    const optional = idempotency(
      async (_req, { tx, scope, body }) => statement(tx, spec(scope, body as Payment)),
      { store, scope, required: false, onError: () => {} },
    );
    const server = createServer((req, res) => (req.url === "/v1/tips" ? optional : keyed)(req, res));
    node = await listen(server);
    closers.push(() => {
      server.close();
      server.closeAllConnections();
    });

    const app = new Hono();
    app.post(
      "/v1/payments",
      honoIdempotency({ store, scope: (c) => c.req.header("x-account") }),
      async (c) => {
        const { tx, scope, body } = c.var.idempotency;
        const reply = await statement(tx, spec(scope, body as Payment));
        return c.body(reply.body, reply.status as 201, reply.headers);
      },
    );
    const ex = express();
    ex.post(
      "/v1/payments",
      express.json(),
      expressIdempotency({ store, scope: (req) => req.header("x-account") }),
      async (req, res) => {
        const { tx, scope, body } = req.idempotency;
        const reply = await statement(tx, spec(scope, body as Payment));
        res.status(reply.status).set(reply.headers).send(reply.body);
      },
    );
    const exServer = createServer(ex);
    exp = await listen(exServer);
    closers.push(() => {
      exServer.close();
      exServer.closeAllConnections();
    });
    const fa = Fastify();
    fa.post(
      "/v1/payments",
      { ...fastifyIdempotency({ store, scope: (req) => req.headers["x-account"] as string | undefined }) },
      async (request, reply) => {
        const { tx, scope, body } = request.idempotency;
        const r = await statement(tx, spec(scope, body as Payment));
        return reply.code(r.status).headers(r.headers).send(r.body);
      },
    );
    await fa.listen({ port: 0, host: "127.0.0.1" });
    fst = `http://127.0.0.1:${(fa.server.address() as AddressInfo).port}`;
    closers.push(() => void fa.close());
    await new Promise<void>((resolve) => {
      const s = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, (info) => {
        hono = `http://127.0.0.1:${info.port}`;
        resolve();
      });
      closers.push(() => s.close());
    });
  });
  afterAll(async () => {
    for (const close of closers) close();
    await open.close();
  });

  const post = (base: string, key: string | undefined, body: unknown, path = "/v1/payments") =>
    fetch(`${base}${path}`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-account": "acct_1",
        ...(key ? { "idempotency-key": `"${key}"` } : {}),
      },
      body: JSON.stringify(body),
    });

  const count = async (): Promise<number> => {
    const { rows } = await open.db.query<{ n: number }>("SELECT count(*)::int AS n FROM payments");
    return rows[0]!.n;
  };

  const bases = () => ({ node, hono, express: exp, fastify: fst });
  for (const adapter of ["node", "hono", "express", "fastify"] as const) {
    const base = () => bases()[adapter];

    it(`${adapter}: answers 201 from the statement, then replays it byte for byte`, async () => {
      const before = await count();
      const key = `k-${adapter}-once`;
      const first = await post(base(), key, { amount_cents: 500, currency: "eur" });
      expect(first.status).toBe(201);
      const bytes = await first.text();
      expect(JSON.parse(bytes)).toMatchObject({ amount_cents: 500, currency: "eur" });
      expect(first.headers.get("content-type")).toMatch(/application\/json/);
      expect(first.headers.get("idempotency-expires")).toBeTruthy();
      const again = await post(base(), key, { amount_cents: 500, currency: "eur" });
      expect(again.status).toBe(201);
      expect(again.headers.get("idempotent-replayed")).toBe("true");
      expect(again.headers.get("x-not-replayed")).toBeNull(); // not on the replay allow-list
      expect(await again.text()).toBe(bytes);
      expect(await count()).toBe(before + 1);
    });

    it(`${adapter}: answers 422 for another body under the same key`, async () => {
      const key = `k-${adapter}-422`;
      expect((await post(base(), key, { amount_cents: 500, currency: "eur" })).status).toBe(201);
      const before = await count();
      const other = await post(base(), key, { amount_cents: 900, currency: "eur" });
      expect(other.status).toBe(422);
      expect(other.headers.get("content-type")).toMatch(/problem\+json/);
      expect(await count()).toBe(before);
    });
  }

  it("node: a handler's validation answer saves nothing and claims nothing", async () => {
    const key = "k-node-invalid";
    const bad = await post(node, key, { amount_cents: "lots" });
    expect(bad.status).toBe(400);
    const { rows } = await open.db.query("SELECT 1 FROM idem.keys WHERE key = $1", [key]);
    expect(rows).toEqual([]);
    // The same key with a valid body is then a new request.
    expect((await post(node, key, { amount_cents: 1, currency: "eur" })).status).toBe(201);
  });

  it("node: a request without a key on a required: false route runs the statement alone", async () => {
    const before = await count();
    const r = await post(node, undefined, { amount_cents: 7, currency: "usd" }, "/v1/tips");
    expect(r.status).toBe(201);
    expect(JSON.parse(await r.text())).toMatchObject({ amount_cents: 7, currency: "usd" });
    expect(await count()).toBe(before + 1);
  });
});
