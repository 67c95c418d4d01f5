/**
 * The peers users pick, each on Express 5 with Redis, each used as its documentation shows, around the
 * same handler (the INSERT autocommitted on a plain pool: none of them gives the handler a transaction).
 * Every Redis key they write contains the run's nonce (BENCH_RUN), so the bench can delete them after.
 */
import { createRequire } from "node:module";
import {
  IdempotencyAlreadyInProgressError,
  IdempotencyConfig,
  IdempotencyValidationError,
  makeIdempotent,
} from "@aws-lambda-powertools/idempotency";
import { CachePersistenceLayer } from "@aws-lambda-powertools/idempotency/cache";
import nodeIdempotency from "@node-idempotency/core";
import redisAdapter from "@node-idempotency/storage-adapter-redis";
import { createClient } from "@redis/client";
import express, { type RequestHandler } from "express";
import expressIdempotency from "express-idempotency";
import { listenExpress, pool, type Started } from "./frameworks.ts";
import { CRASH_HEADER, CREATED, insertPayment, PATH, type Payment, prepared } from "./handler.ts";
import { REDIS_URL } from "./redis.ts";
import { POWERTOOLS_REMAINING_MS, type Variant } from "./variants.ts";

const RUN = process.env.BENCH_RUN ?? "run";
// express-idempotency-redis-adapter ships no type declarations.
const require = createRequire(import.meta.url);
const { default: ExpressRedisAdapter } = require("express-idempotency-redis-adapter");

export async function startPeer(v: Variant, url: string): Started {
  const db = prepared(pool(url));
  const app = express();
  const crash = (req: express.Request) => req.get(CRASH_HEADER) !== undefined;
  switch (v.name) {
    case "express-idempotency": {
      // Its README: a data adapter, the middleware, and `isHit` in the handler (the middleware has
      // already answered a replay and calls next() anyway).
      const adapter = new ExpressRedisAdapter({ connectionConfig: { url: REDIS_URL } });
      await adapter.connect();
      const service = () => expressIdempotency.getSharedIdempotencyService();
      app.post(
        PATH,
        express.json(),
        expressIdempotency.idempotency({ dataAdapter: adapter }),
        async (req, res) => {
          if (service().isHit(req)) return;
          try {
            res
              .status(CREATED)
              .json(await insertPayment(db, req.get("idempotency-key"), req.body, crash(req)));
          } catch (err) {
            await service().reportError(req);
            throw err;
          }
        },
      );
      return listenExpress(app);
    }
    case "node-idempotency": {
      const storage = new redisAdapter.RedisStorageAdapter({ url: REDIS_URL });
      await storage.connect();
      const idem = new nodeIdempotency.Idempotency(storage, { cacheKeyPrefix: `bench-${RUN}` });
      app.post(PATH, express.json(), nodeIdempotencyMiddleware(idem), async (req, res) => {
        res.status(CREATED).json(await insertPayment(db, req.get("idempotency-key"), req.body, crash(req)));
      });
      return listenExpress(app);
    }
    case "powertools": {
      const client = await createClient({ url: REDIS_URL }).connect();
      const persistenceStore = new CachePersistenceLayer({ client: client as never });
      // No payloadValidationJmesPath: in 2.35.0 the cache layer drops the payload hash when it completes
      // a record, so with validation on every replay is answered 422 (mismatch).
      const config = new IdempotencyConfig({ eventKeyJmesPath: "key" });
      // Outside Lambda there is no context; without one Powertools cannot tell a key in progress from
      // an abandoned one. This stands in for it: the time a request may take.
      const context = { getRemainingTimeInMillis: () => POWERTOOLS_REMAINING_MS };
      const pay = makeIdempotent(
        async (event: { key: string; body: Payment; crash: boolean }, _context: unknown) =>
          insertPayment(db, event.key, event.body, event.crash),
        { persistenceStore, config, keyPrefix: `bench-${RUN}` },
      );
      app.post(PATH, express.json(), async (req, res) => {
        try {
          const event = { key: req.get("idempotency-key") ?? "", body: req.body, crash: crash(req) };
          res.status(CREATED).json(await pay(event, context));
        } catch (err) {
          if (err instanceof IdempotencyAlreadyInProgressError) res.status(409);
          else if (err instanceof IdempotencyValidationError) res.status(422);
          throw err;
        }
      });
      return listenExpress(app);
    }
    default:
      throw new Error(`not a peer: ${v.name}`);
  }
}

/**
 * @node-idempotency publishes its core and a NestJS plugin, not an Express one: this middleware does
 * what its (unpublished) Express plugin does. `onRequest` claims the key (SET NX) or returns the saved
 * response; the handler's answer is saved by `onResponse` as it is sent, without waiting for Redis.
 */
function nodeIdempotencyMiddleware(idem: InstanceType<typeof nodeIdempotency.Idempotency>): RequestHandler {
  return async function nodeIdempotencyExpress(req, res, next) {
    const params = { headers: req.headers, body: req.body, path: req.url, method: req.method };
    let saved: Awaited<ReturnType<typeof idem.onRequest>>;
    try {
      saved = await idem.onRequest(params);
    } catch (err) {
      if (!(err instanceof nodeIdempotency.IdempotencyError)) return next(err);
      const code = err.code as string;
      res.status(
        code === "REQUEST_IN_PROGRESS" ? 409 : code === "IDEMPOTENCY_FINGERPRINT_MISSMATCH" ? 422 : 400,
      );
      if (code === "REQUEST_IN_PROGRESS") res.set("retry-after", "1");
      return next(err);
    }
    if (saved) {
      res.status(Number(saved.additional?.statusCode ?? 200)).set("idempotent-replayed", "true");
      res.json(saved.body);
      return;
    }
    const json = res.json.bind(res);
    res.json = (body: unknown) => {
      void idem.onResponse(params, { body, additional: { statusCode: res.statusCode } }).catch(() => {});
      return json(body);
    };
    next();
  };
}
