/**
 * What each adapter costs on top of its own framework, without a database (issue 30: every adapter
 * should cost about the same over its bare handler). Each framework's bare handler and idem's adapter
 * on it serve the same payment from a store that answers at once (no SQL), in this process; wrk loads
 * one server at a time in interleaved 2 s slices, and this process's CPU per request is read around
 * each slice. The difference idem - bare is the adapter plus the lifecycle, free of PostgreSQL's noise.
 *
 *   NODE_ENV=production tsx bench/compare/adapter-cost.ts [names...]   (ROUNDS, default 5)
 *
 * Names: bare-node idem-node bare-express idem-express bare-hono idem-hono bare-fastify idem-fastify
 * bare-nest idem-nest (NestJS 12 on Express, its default platform) (default: all). idem is imported from
 * its built package (`npm run build` first).
 */
import "reflect-metadata";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { Controller, type DynamicModule, Module, Post, Req } from "@nestjs/common";
import { NestFactory } from "@nestjs/core";
import express from "express";
import Fastify from "fastify";
import { Hono } from "hono";
import type { AtomicStore } from "idem";
import { idempotency as expressIdempotency, keepRawBody } from "idem/express";
import { idempotency as fastifyIdempotency } from "idem/fastify";
import { idempotency as honoIdempotency, type IdempotencyEnv } from "idem/hono";
import { IdempotencyCtx, IdempotencyModule, Idempotent, type NestIdempotencyContext } from "idem/nestjs";
import { idempotency as nodeIdempotency } from "idem/node";
import type { Tx } from "idem/postgres";
import { readJson } from "./frameworks.ts";
import { PATH, type Payment } from "./handler.ts";
import { wrk } from "./wrk.ts";

const ROW = { id: "1", amount_cents: 5000, currency: "eur" };
interface Q {
  query(sql: string, params: unknown[]): Promise<{ rows: (typeof ROW)[] }>;
}
const db: Q = { query: async () => ({ rows: [ROW] }) };
const tx = db as unknown as Tx;
/** Runs the work at once and says it was saved: the lifecycle and the adapter run as on PostgreSQL. */
const store: AtomicStore<Tx> = {
  retentionMs: 86_400_000,
  lockTimeoutMs: 5000,
  async atomic(_claim, work) {
    const r = await work(tx);
    return {
      kind: "executed",
      response: r.response,
      saved: r.save !== undefined,
      expiresAt: new Date(Date.now() + 86_400_000),
      claimId: "0190a0a0-0000-7000-8000-000000000000",
    };
  },
  transaction: (work) => work(tx),
};
const scope = () => "acct_bench";
const options = { store, scope, effectsInTxOnly: true };
const pay = async (q: Q | Tx, body: Payment) =>
  (await (q as Q).query("INSERT", [body.amount_cents, body.currency])).rows[0];

interface Running {
  port: number;
  close(): void;
}

function listen(server: Server): Promise<Running> {
  return new Promise((resolve) => {
    server.listen(0, "127.0.0.1", () =>
      resolve({ port: (server.address() as AddressInfo).port, close: () => server.close() }),
    );
  });
}

async function start(name: string): Promise<Running> {
  const idem = name.startsWith("idem-");
  switch (name.slice(name.indexOf("-") + 1)) {
    case "node":
      return listen(
        createServer(
          idem
            ? nodeIdempotency(
                async (_req, ctx) => ({
                  status: 201,
                  headers: { "content-type": "application/json" },
                  body: JSON.stringify(await pay(ctx.tx, ctx.body as Payment)),
                }),
                options,
              )
            : (req, res) => {
                readJson(req)
                  .then((body) => pay(db, body))
                  .then((row) =>
                    res.writeHead(201, { "content-type": "application/json" }).end(JSON.stringify(row)),
                  );
              },
        ),
      );
    case "express": {
      const app = express();
      if (idem) {
        app.post(
          PATH,
          express.json({ verify: keepRawBody }),
          expressIdempotency(options),
          async (req, res) => {
            res.status(201).json(await pay(req.idempotency.tx, req.body));
          },
        );
      } else {
        app.post(PATH, express.json(), async (req, res) => {
          res.status(201).json(await pay(db, req.body));
        });
      }
      return listen(createServer(app));
    }
    case "hono": {
      const app = new Hono<IdempotencyEnv>();
      if (idem) {
        app.post(PATH, honoIdempotency(options), async (c) =>
          c.json(await pay(c.var.idempotency.tx, await c.req.json()), 201),
        );
      } else app.post(PATH, async (c) => c.json(await pay(db, await c.req.json()), 201));
      return new Promise((resolve) => {
        const server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, (info) =>
          resolve({ port: info.port, close: () => server.close() }),
        );
      });
    }
    case "fastify": {
      const app = Fastify();
      if (idem) {
        app.post(PATH, { ...fastifyIdempotency(options) }, async (request, reply) =>
          reply.code(201).send(await pay(request.idempotency.tx, request.body as Payment)),
        );
      } else {
        app.post(PATH, async (request, reply) =>
          reply.code(201).send(await pay(db, request.body as Payment)),
        );
      }
      await app.listen({ port: 0, host: "127.0.0.1" });
      return { port: (app.server.address() as AddressInfo).port, close: () => void app.close() };
    }
    case "nest": {
      const app = await NestFactory.create(idem ? IdemNestApp : BareNestApp, {
        rawBody: idem,
        logger: false,
      });
      await app.listen(0, "127.0.0.1");
      return { port: app.getHttpServer().address().port, close: () => void app.close() };
    }
    default:
      throw new Error(`unknown server ${name}`);
  }
}

// NestJS as its users write it: a controller returning the row (POST answers 201), and idem's module with
// `@Idempotent()` and `@IdempotencyCtx()`, the app created with `rawBody: true` as idem/nestjs documents.
@Controller()
class BareNestController {
  @Post(PATH)
  create(@Req() req: { body: Payment }) {
    return pay(db, req.body);
  }
}
@Controller()
class IdemNestController {
  @Post(PATH)
  @Idempotent()
  create(@IdempotencyCtx() idem: NestIdempotencyContext<Payment>) {
    return pay(idem.tx, idem.body);
  }
}
@Module({ controllers: [BareNestController] })
class BareNestApp {}
const idemModule: DynamicModule = IdempotencyModule.forRoot(options);
@Module({ imports: [idemModule], controllers: [IdemNestController] })
class IdemNestApp {}

const ALL = ["node", "express", "hono", "fastify", "nest"].flatMap((f) => [`bare-${f}`, `idem-${f}`]);
const names = process.argv.length > 2 ? process.argv.slice(2) : ALL;
const servers = new Map<string, Running>();
for (const n of names) servers.set(n, await start(n));
const cpu = new Map<string, number[]>(names.map((n) => [n, []]));
const rounds = Number(process.env.ROUNDS ?? 5);
for (let round = 0; round < rounds; round++) {
  for (const n of names) {
    const before = process.cpuUsage();
    const w = await wrk(`http://127.0.0.1:${servers.get(n)!.port}`, {
      mode: n.startsWith("idem-") ? "keyed" : "bare",
      prefix: `r${round}-${Date.now().toString(36)}`,
      replayKeys: 1,
      seconds: 2,
      connections: 32,
    });
    const used = process.cpuUsage(before);
    cpu.get(n)!.push((used.user + used.system) / w.requests);
  }
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
for (const n of names) {
  const xs = cpu.get(n)!;
  const bare = n.startsWith("idem-") ? cpu.get(n.replace("idem-", "bare-")) : undefined;
  const over = bare ? `  idem - bare ${(median(xs) - median(bare)).toFixed(1)} µs` : "";
  console.log(
    `${n.padEnd(13)} ${median(xs).toFixed(1).padStart(6)} µs/req (rounds: ${xs.map((x) => x.toFixed(0)).join(" ")})${over}`,
  );
}
for (const s of servers.values()) s.close();
process.exit(0);
