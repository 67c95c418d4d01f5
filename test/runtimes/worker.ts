/**
 * The contract's payments app (app.ts) as a Cloudflare Worker, for workerd: bundled by esbuild and
 * served by test/runtimes/workerd.slow.test.ts. Bindings: DB_URL (PostgreSQL on loopback, reached over
 * `connect()` from cloudflare:sockets) and DRIVER (`postgres` or `pg`).
 *
 * A Worker may not use a connection opened while serving another request, so the driver's client is
 * made per request and closed after it (`perRequestDb`); the store, made once per isolate, reaches the
 * database through whichever request is running.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import postgres from "postgres";
import type { Db } from "../../src/postgres/db.ts";
import { fromPg } from "../../src/postgres/drivers/pg.ts";
import { fromPostgresJs } from "../../src/postgres/drivers/postgres-js.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { runtimeApp } from "./app.ts";

interface Env {
  DB_URL: string;
  DRIVER: string;
}
interface ExecutionContext {
  waitUntil(promise: Promise<unknown>): void;
}

const current = new AsyncLocalStorage<Db>();
const db = (): Db => {
  const d = current.getStore();
  if (!d) throw new Error("no request is running: the database is reached per request");
  return d;
};

/** A `Db` that runs each statement on the current request's own client. */
const perRequestDb: Db = {
  get driver() {
    return db().driver;
  },
  get supportsBefore() {
    return db().supportsBefore;
  },
  get supportsBeginParams() {
    return db().supportsBeginParams;
  },
  query: (sql, params) => db().query(sql, params),
  exec: (sql) => db().exec(sql),
  transaction: (fn, options) => db().transaction(fn, options),
  close: async () => {},
};

async function open(env: Env): Promise<Db> {
  if (env.DRIVER === "pg") {
    // Loaded only when asked for: a Worker that uses postgres.js never evaluates pg.
    const { default: pg } = await import("pg");
    const pool = new pg.Pool({ connectionString: env.DB_URL, max: 4 });
    pool.on("error", () => {});
    return fromPg(pool);
  }
  // A connection that cannot be made fails in 2 s (answered 503), rather than when the request is cut.
  return fromPostgresJs(postgres(env.DB_URL, { max: 4, connect_timeout: 2, onnotice: () => {} }));
}

let app: ((request: Request) => Promise<Response>) | undefined;

export default {
  async fetch(request: Request, env: Env, ctx: ExecutionContext): Promise<Response> {
    const requestDb = await open(env);
    try {
      return await current.run(requestDb, async () => {
        app ??= runtimeApp(
          await PostgresStore.open(perRequestDb, { lockTimeoutMs: 1_000 }),
          "contract-workerd",
        );
        return await app(request);
      });
    } finally {
      ctx.waitUntil(requestDb.close().catch(() => {}));
    }
  },
};
