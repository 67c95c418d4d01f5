/**
 * What a careful engineer would write by hand for the keyed handler, as the yardstick of idem's keyed
 * path (issue 30): the same one-INSERT payment, one key per request, the reply saved. hand-tx runs on
 * every framework (`hand-tx` on node:http, `hand-tx-express`, ..., `hand-tx-nest` in nest.ts), hand-cte
 * on node:http.
 *
 *   hand-tx   BEGIN; INSERT key ON CONFLICT DO NOTHING; INSERT payment  (one write, pipelined)
 *             UPDATE key SET reply; COMMIT                               (one write)
 *             a key already there: ROLLBACK and read its reply (409 while it has none)
 *   hand-cte  one autocommitted statement: claim the key, INSERT the payment only if claimed, save the
 *             reply, and read the saved reply of a key claimed before
 *
 * Neither has a fingerprint, retention, bounded waits that free the connection, or sealing: they
 * price the statements, not the guarantees. Every statement is sent named (prepared once per
 * connection), as idem sends its own: until issue 65 they were sent unnamed, so PostgreSQL parsed and
 * planned each on every request and the yardstick cost PostgreSQL about 1.5 times what a careful
 * engineer's code costs.
 */
import { createServer } from "node:http";
import express from "express";
import Fastify from "fastify";
import { Hono } from "hono";
import type { ContentfulStatusCode } from "hono/utils/http-status";
import type pg from "pg";
import {
  listenExpress,
  listenFastify,
  listenHono,
  listenNode,
  pool,
  readJson,
  type Started,
} from "./frameworks.ts";
import { CREATED, PATH, type Payment } from "./handler.ts";
import type { Variant } from "./variants.ts";

const INSERT =
  "INSERT INTO payments (idem_key, amount_cents, currency) VALUES ($1, $2, $3) RETURNING id, amount_cents, currency";
const CLAIM = "INSERT INTO hand_keys (key) VALUES ($1) ON CONFLICT DO NOTHING";
const SAVE = "UPDATE hand_keys SET status = $2, body = $3 WHERE key = $1";
const READ = "SELECT status, body FROM hand_keys WHERE key = $1";
const CTE = `WITH k AS (INSERT INTO hand_keys (key) VALUES ($1) ON CONFLICT DO NOTHING RETURNING key),
  p AS (INSERT INTO payments (idem_key, amount_cents, currency) SELECT key, $2, $3 FROM k
        RETURNING id, amount_cents, currency),
  r AS (INSERT INTO hand_replies (key, status, body)
        SELECT $1, 201, json_build_object('id', p.id::text, 'amount_cents', p.amount_cents, 'currency', p.currency)::text
          FROM p RETURNING body)
  SELECT (SELECT body FROM r) AS body, (SELECT body FROM hand_replies WHERE key = $1) AS saved`;

/** A statement prepared once per connection (node-postgres parses and plans a named one once). */
const named = (name: string, text: string) => (values: unknown[]) => ({ name, text, values });
const claim = named("hand_claim", CLAIM);
const insert = named("hand_insert", INSERT);
const save = named("hand_save", SAVE);
const read = named("hand_read", READ);
const cte = named("hand_cte", CTE);

interface Reply {
  status: number;
  body: string;
}
const IN_FLIGHT: Reply = { status: 409, body: '{"error":"in flight"}' };

type Wire = { cork(): void; uncork(): void };
const wireOf = (c: pg.PoolClient) => (c as unknown as { connection: { stream: Wire } }).connection.stream;

async function handTx(db: pg.Pool, key: string, p: Payment): Promise<Reply> {
  const client = await db.connect();
  const wire = wireOf(client);
  try {
    wire.cork();
    const begin = client.query("BEGIN");
    const claimed = client.query(claim([key]));
    const paid = client.query(insert([key, p.amount_cents, p.currency]));
    wire.uncork();
    paid.catch(() => {});
    await begin;
    if ((await claimed).rowCount === 0) {
      await paid.catch(() => {});
      wire.cork();
      const rolledBack = client.query("ROLLBACK");
      const saved = client.query(read([key]));
      wire.uncork();
      await rolledBack;
      const row = (await saved).rows[0];
      return row?.status ? { status: row.status, body: row.body } : IN_FLIGHT;
    }
    const body = JSON.stringify((await paid).rows[0]);
    wire.cork();
    const saved = client.query(save([key, CREATED, body]));
    const commit = client.query("COMMIT");
    wire.uncork();
    await saved;
    await commit;
    return { status: CREATED, body };
  } catch (err) {
    await client.query("ROLLBACK").catch(() => {});
    throw err;
  } finally {
    client.release();
  }
}

async function handCte(db: pg.Pool, key: string, p: Payment): Promise<Reply> {
  const { rows } = await db.query(cte([key, p.amount_cents, p.currency]));
  const r = rows[0]!;
  const body = r.body ?? r.saved;
  return body ? { status: CREATED, body } : IN_FLIGHT;
}

/** A reply as every framework sends it: the status, and the body as JSON text. */
type Answer = (key: string, body: Payment) => Promise<Reply>;

export function startHand(v: Variant, url: string): Started {
  const db = pool(url, v.name !== "hand-cte");
  const run = v.name === "hand-cte" ? handCte : handTx;
  const answer: Answer = (key, body) => run(db, key, body);
  switch (v.framework) {
    case "node":
      return listenNode(
        createServer((req, res) => {
          const key = req.headers["idempotency-key"];
          if (typeof key !== "string") {
            res.writeHead(400).end();
            return;
          }
          readJson(req)
            .then((body) => answer(key, body))
            .then((reply) => {
              res.writeHead(reply.status, { "content-type": "application/json" }).end(reply.body);
            })
            .catch(() => res.writeHead(500).end());
        }),
      );
    // On the other frameworks, hand-tx as their users would write it: the framework's own body parser
    // and reply, so that idem on that framework is compared with the same work done by hand there.
    case "express": {
      const app = express();
      app.post(PATH, express.json(), async (req, res) => {
        const key = req.get("idempotency-key");
        if (!key) return void res.status(400).end();
        const reply = await answer(key, req.body);
        res.status(reply.status).type("application/json").send(reply.body);
      });
      return listenExpress(app);
    }
    case "hono": {
      const app = new Hono();
      app.post(PATH, async (c) => {
        const key = c.req.header("idempotency-key");
        if (!key) return c.body(null, 400);
        const reply = await answer(key, await c.req.json());
        return c.body(reply.body, reply.status as ContentfulStatusCode, {
          "content-type": "application/json",
        });
      });
      return listenHono(app);
    }
    case "nest":
      return import("./nest.ts").then((nest) => nest.startNestHand(answer));
    case "fastify": {
      const app = Fastify();
      app.post(PATH, async (request, reply) => {
        const key = request.headers["idempotency-key"];
        if (typeof key !== "string") return reply.code(400).send();
        const r = await answer(key, request.body as Payment);
        return reply.code(r.status).type("application/json").send(r.body);
      });
      return listenFastify(app);
    }
  }
}
