/**
 * The bare handler and idem's adapters on each framework. idem is imported through the package's public
 * entry points (`idem/express`, `idem/hono`, ...; the `source` condition maps them to src/), so this
 * measures whatever those entry points do today.
 */
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import express, { type ErrorRequestHandler } from "express";
import Fastify from "fastify";
import { Hono } from "hono";
import { idempotency as expressIdempotency, keepRawBody } from "idem/express";
import { idempotency as fastifyIdempotency } from "idem/fastify";
import { idempotency as honoIdempotency } from "idem/hono";
import { idempotency } from "idem/node";
import { fromPg, PostgresStore } from "idem/postgres";
import pg from "pg";
import { CRASH_HEADER, CREATED, insertPayment, PATH, type Payment, prepared } from "./handler.ts";
import { POOL_SIZE, SCOPE, type Variant } from "./variants.ts";

/** A listening server's port. */
export type Started = Promise<number>;

/**
 * A pool of POOL_SIZE. Idle connections close after a second: the variants wait their turn side by
 * side, and PostgreSQL's max_connections is shared.
 */
export function pool(url: string, pipeline = false): pg.Pool {
  const p = new pg.Pool({
    connectionString: url,
    max: POOL_SIZE,
    idleTimeoutMillis: 1000,
    ...(pipeline ? { pipeline: true } : {}),
  } as pg.PoolConfig);
  p.on("error", () => {});
  return p;
}

/** Express's default error handler logs every error: answer with the status set, quietly. */
export const quietErrors: ErrorRequestHandler = (err, _req, res, _next) => {
  res.status(res.statusCode >= 400 ? res.statusCode : 500).json({ error: String(err?.message ?? err) });
};

export function listenExpress(app: express.Express): Started {
  app.use(quietErrors);
  return new Promise((resolve) => {
    const server: Server = app.listen(0, "127.0.0.1", () => resolve((server.address() as AddressInfo).port));
  });
}

const crashOf = (h: IncomingMessage["headers"]) => h[CRASH_HEADER] !== undefined;
const keyOf = (h: IncomingMessage["headers"]) => h["idempotency-key"] as string | undefined;

export function readJson(req: IncomingMessage): Promise<Payment> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      try {
        resolve(JSON.parse(Buffer.concat(chunks).toString()));
      } catch (err) {
        reject(err);
      }
    });
    req.on("error", reject);
  });
}

async function bare(v: Variant, url: string): Started {
  const db = prepared(pool(url));
  switch (v.framework) {
    case "express": {
      const app = express();
      app.post(PATH, express.json(), async (req, res) => {
        res.status(CREATED).json(await insertPayment(db, keyOf(req.headers), req.body, crashOf(req.headers)));
      });
      return listenExpress(app);
    }
    case "hono": {
      const app = new Hono();
      app.post(PATH, async (c) => {
        const row = await insertPayment(
          db,
          c.req.header("idempotency-key"),
          await c.req.json(),
          c.req.header(CRASH_HEADER) !== undefined,
        );
        return c.json(row, CREATED);
      });
      return listenHono(app);
    }
    case "fastify": {
      const app = Fastify();
      app.post(PATH, async (request, reply) =>
        reply
          .code(CREATED)
          .send(
            await insertPayment(
              db,
              keyOf(request.headers),
              request.body as Payment,
              crashOf(request.headers),
            ),
          ),
      );
      return listenFastify(app);
    }
    case "nest":
      throw new Error("the NestJS variants are started by nest.ts");
    case "node": {
      const server = createServer((req, res) => {
        readJson(req)
          .then((body) => insertPayment(db, keyOf(req.headers), body, crashOf(req.headers)))
          .then((row) => {
            res.writeHead(CREATED, { "content-type": "application/json" }).end(JSON.stringify(row));
          })
          .catch(() => res.writeHead(500).end());
      });
      return listenNode(server);
    }
  }
}

async function withIdem(v: Variant, url: string): Started {
  const store = await PostgresStore.open(fromPg(pool(url, true)));
  const scope = () => SCOPE;
  // The handler's only effect is its INSERT in the key's transaction, so it may be sent with the claim.
  const effectsInTxOnly = process.env.BENCH_NO_SPECULATE !== "1";
  switch (v.framework) {
    case "express": {
      const app = express();
      // As in idem/express's documentation: the parser keeps the bytes, idem fingerprints them.
      app.post(
        PATH,
        express.json({ verify: keepRawBody }),
        expressIdempotency({ store, scope, effectsInTxOnly }),
        async (req, res) => {
          const { tx, key } = req.idempotency;
          res.status(CREATED).json(await insertPayment(tx, key, req.body, crashOf(req.headers)));
        },
      );
      return listenExpress(app);
    }
    case "hono": {
      const app = new Hono();
      app.post(PATH, honoIdempotency({ store, scope, effectsInTxOnly }), async (c) => {
        const { tx, key } = c.var.idempotency;
        const row = await insertPayment(
          tx,
          key,
          await c.req.json(),
          c.req.header(CRASH_HEADER) !== undefined,
        );
        return c.json(row, CREATED);
      });
      return listenHono(app);
    }
    case "fastify": {
      const app = Fastify();
      const idem = fastifyIdempotency({ store, scope, effectsInTxOnly });
      app.post(PATH, { ...idem }, async (request, reply) => {
        const { tx, key } = request.idempotency;
        return reply
          .code(CREATED)
          .send(await insertPayment(tx, key, request.body as Payment, crashOf(request.headers)));
      });
      return listenFastify(app);
    }
    case "nest":
      throw new Error("the NestJS variants are started by nest.ts");
    case "node": {
      const server = createServer(
        idempotency(
          async (req, { tx, key, body }) => {
            const row = await insertPayment(tx, key, body as Payment, crashOf(req.headers)); // read once, parsed
            return {
              status: CREATED,
              headers: { "content-type": "application/json" },
              body: JSON.stringify(row),
            };
          },
          { store, scope, effectsInTxOnly },
        ),
      );
      return listenNode(server);
    }
  }
}

export async function listenFastify(app: ReturnType<typeof Fastify>): Started {
  await app.listen({ port: 0, host: "127.0.0.1" });
  return (app.server.address() as AddressInfo).port;
}

export function listenHono(app: Hono): Started {
  return new Promise((resolve) => {
    serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, (info) => resolve(info.port));
  });
}

export function listenNode(server: Server): Started {
  return new Promise((resolve) => {
    server.listen(0, "127.0.0.1", () => resolve((server.address() as AddressInfo).port));
  });
}

export function startFramework(v: Variant, url: string): Started {
  return v.kind === "bare" ? bare(v, url) : withIdem(v, url);
}
