/**
 * The operations console from the package (`idem/admin`'s `adminConsole`): its page, script, style and
 * API served under one path, mounted on every adapter users have: Hono (a fetch handler), node:http,
 * Express and Fastify (through `toNodeListener`). The page names its script and style under the path it
 * is mounted at, the script finds the API beside it, and the API refuses a request without a token.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import express from "express";
import Fastify from "fastify";
import { Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  adminConsole,
  bearerTokens,
  Operations,
  parseAdminTokens,
  toNodeListener,
} from "../../src/admin/index.ts";
import type { Db } from "../../src/postgres/db.ts";
import { fromPglite } from "../../src/postgres/drivers/pglite.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { newPglite } from "../helpers/db.ts";

const TOKEN = "token-of-alice-0123456789";

let db: Db;
let handler: ReturnType<typeof adminConsole>;
beforeAll(async () => {
  db = fromPglite(await newPglite());
  await migrate(db);
  const store = await PostgresStore.open(db);
  handler = adminConsole({
    operations: new Operations({ store, db }),
    authorize: bearerTokens(parseAdminTokens(`alice:${TOKEN}`)),
    basePath: "/ops/console",
  });
});
afterAll(() => db?.close());

const listen = (server: Server) =>
  new Promise<{ url: string; close(): Promise<void> }>((resolve) =>
    server.listen(0, "127.0.0.1", () =>
      resolve({
        url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
        close: () => new Promise((r) => server.close(() => r())),
      }),
    ),
  );

const adapters: Record<string, () => Promise<{ url: string; close(): Promise<void> }>> = {
  hono: async () => {
    const app = new Hono();
    app.all("/ops/console/*", (c) => handler(c.req.raw));
    app.all("/ops/console", (c) => handler(c.req.raw));
    return new Promise((resolve) => {
      const server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, ({ port }) =>
        resolve({
          url: `http://127.0.0.1:${port}`,
          close: () => new Promise((r) => server.close(() => r())),
        }),
      );
    });
  },
  "node:http": () => listen(createServer(toNodeListener(handler))),
  express: () => {
    const app = express();
    app.use("/ops/console", toNodeListener(handler)); // Express strips the mount path; originalUrl keeps it
    return listen(createServer(app));
  },
  fastify: async () => {
    const app = Fastify();
    const listener = toNodeListener(handler);
    // In a scope of its own that leaves request bodies unread: the console's API reads them itself.
    await app.register(async (scope) => {
      scope.removeAllContentTypeParsers();
      scope.addContentTypeParser("*", (_req, _payload, done) => done(null));
      for (const path of ["/ops/console", "/ops/console/*"]) {
        scope.all(path, (req, reply) => {
          reply.hijack();
          listener(req.raw, reply.raw);
        });
      }
    });
    await app.listen({ port: 0, host: "127.0.0.1" });
    return {
      url: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`,
      close: () => app.close(),
    };
  },
};

describe.each(Object.keys(adapters))("the operations console on %s", (name) => {
  let base: { url: string; close(): Promise<void> };
  beforeAll(async () => {
    base = await adapters[name]!();
  });
  afterAll(() => base?.close());

  it("serves the page, its script and style, and the API beside them", async () => {
    const page = await fetch(`${base.url}/ops/console`);
    expect(page.status).toBe(200);
    expect(page.headers.get("content-type")).toBe("text/html; charset=utf-8");
    expect(page.headers.get("content-security-policy")).toContain("script-src 'self'");
    const html = await page.text();
    expect(html).toContain('<script type="module" src="/ops/console/console.js"></script>');
    expect(html).toContain('href="/ops/console/console.css"');
    expect(html).toContain('href="/ops/console/look.css"');
    const script = await fetch(`${base.url}/ops/console/console.js`);
    expect(script.headers.get("content-type")).toBe("text/javascript; charset=utf-8");
    expect(await script.text()).toContain('new URL("api", import.meta.url)');
    expect((await fetch(`${base.url}/ops/console/console.css`)).status).toBe(200);
    const look = await fetch(`${base.url}/ops/console/look.css`);
    expect(look.headers.get("content-type")).toBe("text/css; charset=utf-8");
    expect(await look.text()).toContain("--line");
    // The API: a token names the person; none is refused.
    const me = await fetch(`${base.url}/ops/console/api/me`, {
      headers: { authorization: `Bearer ${TOKEN}` },
    });
    expect(await me.json()).toMatchObject({ actor: "alice" });
    expect((await fetch(`${base.url}/ops/console/api/me`)).status).toBe(401);
    const settle = await fetch(`${base.url}/ops/console/api/keys/settle`, {
      method: "POST",
      headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" },
      body: JSON.stringify({ scope: "acct", key: "nothing", note: "n/a", answer: { status: 200 } }),
    });
    // The body reached the API, which found no open review for that key.
    expect(settle.status).toBe(409);
    expect(await settle.json()).toMatchObject({ status: 409 });
    expect((await fetch(`${base.url}/ops/console/nothing-here`)).status).toBe(404);
  });
});
