/**
 * A small Hono app over idem's PostgresStore for the core rules tests: requests go through `app.request`
 * (a real `Request`, no socket), so a test file starts in about a second. The handler counts how often
 * it ran per key and answers what the request asks for: `x-status` (default 201) and `x-reply-headers`
 * (a JSON object of headers to send). The scope is `acct_1`, or none (not authenticated) when the
 * request sends `x-anonymous`.
 *
 * The database: a schema of its own on the real server when DATABASE_URL is set (what `npm run mutate`
 * uses: a PGlite instance takes 5-20 s to start on a loaded machine, once per mutant), else PGlite.
 */
import { randomBytes } from "node:crypto";
import { Hono } from "hono";
import pg from "pg";
import { type IdempotencyEnv, idempotency } from "../../src/http/hono.ts";
import { type Db, fromPg, fromPglite, migrate, PostgresStore } from "../../src/postgres/index.ts";
import { newPglite } from "../helpers/db.ts";

/** A migrated database for one test file. */
export interface CoreDb {
  db: Db;
  /** The schema of idem's tables (give it to `PostgresStore.open` and qualify your own tables with it). */
  schema: string;
  /** From now on the database cannot be reached (a refused connection; PGlite: closed). */
  goDown(): Promise<void>;
  close(): Promise<void>;
}

export async function openCoreDb(): Promise<CoreDb> {
  const url = process.env.DATABASE_URL;
  if (!url) {
    const db = fromPglite(await newPglite());
    await migrate(db);
    let closed = false;
    const close = async () => {
      if (!closed) await db.close();
      closed = true;
    };
    return { db, schema: "idem", goDown: close, close };
  }
  const schema = `core_${randomBytes(5).toString("hex")}`;
  const pool = new pg.Pool({ connectionString: url, max: 4 });
  pool.on("error", () => {});
  const real = fromPg(pool);
  await migrate(real, { schema });
  let current: Db = real;
  let down: pg.Pool | undefined;
  const db: Db = {
    driver: "pg",
    query: (sql, params) => current.query(sql, params),
    exec: (sql) => current.exec(sql),
    transaction: (fn, options) => current.transaction(fn, options),
    close: async () => {},
  };
  return {
    db,
    schema,
    async goDown() {
      down = new pg.Pool({ host: "127.0.0.1", port: 1, user: "postgres", database: "test" });
      down.on("error", () => {});
      current = fromPg(down);
    },
    async close() {
      await real.exec(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await pool.end();
      await down?.end();
    },
  };
}

export interface RulesApp {
  /** Send a request to `path` (default POST with a JSON body). */
  send(path: string, init: RequestInit & { key?: string }): Promise<Response>;
  /** How often the handler ran. */
  runs(): number;
  /** The operation_ref of a key of this app's scope. */
  encodeRef(key: string): string;
  /** What a reference the store sealed names (undefined when it does not open). */
  decodeRef(ref: string): { scope: string; key: string; claimId?: string } | undefined;
  /** From now on the database cannot be reached. */
  goDown(): Promise<void>;
  close(): Promise<void>;
}

export type RouteOptions = Omit<Parameters<typeof idempotency>[0], "store" | "scope">;

/** One app per test file: `routes` maps a path prefix to the idempotency options of that route. */
export async function startRulesApp(routes: Record<string, RouteOptions>): Promise<RulesApp> {
  const core = await openCoreDb();
  const store = await PostgresStore.open(core.db, { schema: core.schema });
  let runs = 0;
  const app = new Hono<IdempotencyEnv>();
  for (const [prefix, options] of Object.entries(routes)) {
    app.all(
      `${prefix}/*`,
      idempotency({ ...options, store, scope: (c) => (c.req.header("x-anonymous") ? undefined : "acct_1") }),
      (c) => {
        runs++;
        const headers = JSON.parse(c.req.header("x-reply-headers") ?? "{}") as Record<string, string>;
        const status = Number(c.req.header("x-status") ?? 201);
        return c.body(JSON.stringify({ run: runs, body: c.var.idempotency.body }), status as 201, {
          "content-type": "application/json",
          ...headers,
        });
      },
    );
  }
  return {
    send(path, { key, headers, ...init }) {
      const h = new Headers(headers);
      if (key !== undefined) h.set("idempotency-key", key);
      return Promise.resolve(app.request(`http://idem.test${path}`, { method: "POST", ...init, headers: h }));
    },
    runs: () => runs,
    encodeRef: (key: string) => store.refs.encode("acct_1", key),
    decodeRef: (ref: string) => store.refs.decode(ref),
    goDown: () => core.goDown(),
    close: () => core.close(),
  };
}
