/**
 * Test databases. Every store test runs against PGlite (in memory) and, when DATABASE_URL is set,
 * against the real PostgreSQL server through both drivers (`pg` and postgres.js). Each call to
 * `open()` gets a database of its own: a new PGlite instance, or a new database on the server that is
 * dropped again by `close()`. In CI (CI=true) DATABASE_URL is required, so the real run cannot be
 * skipped by accident.
 */
import { randomBytes } from "node:crypto";
import { PGlite } from "@electric-sql/pglite";
import pg from "pg";
import postgres from "postgres";
import { it } from "vitest";
import type { Db } from "../../src/postgres/db.ts";
import { fromPg } from "../../src/postgres/drivers/pg.ts";
import { fromPglite } from "../../src/postgres/drivers/pglite.ts";
import { fromPostgresJs } from "../../src/postgres/drivers/postgres-js.ts";

export const DATABASE_URL = process.env.DATABASE_URL;
if (process.env.CI && !DATABASE_URL) {
  throw new Error(
    "CI=true but DATABASE_URL is not set: the store tests must run against the real PostgreSQL",
  );
}

/** Why the tests that need the real PostgreSQL do not run here (undefined: DATABASE_URL is set). */
export const NO_SERVER = DATABASE_URL ? undefined : "needs the real PostgreSQL: set DATABASE_URL";

/**
 * Called at the top of a file whose tests all need the real server: without one, the file reports a
 * skipped test that says why (and is not left with no suite, which vitest counts as a failure).
 */
export function sayWhySkippedWithoutServer(): void {
  if (NO_SERVER) it.skip(`skipped: ${NO_SERVER}`, () => {});
}

export interface OpenDb {
  db: Db;
  /** The connection URL of the fresh database (real server only). */
  url?: string;
  close(): Promise<void>;
}

export interface TestBackend {
  name: "pglite" | "pg" | "postgres";
  open(): Promise<OpenDb>;
}

/**
 * What every test database's name starts with: DATABASE_URL's own database name (`.../test` gives
 * `test_...`), so that runs beside each other on one server, each with a DATABASE_URL of its own, can
 * tell their databases apart (and an operator can find a killed run's leftovers by that prefix).
 */
export const DATABASE_PREFIX = (() => {
  const name = DATABASE_URL ? decodeURIComponent(new URL(DATABASE_URL).pathname.slice(1)) : "";
  const safe = name
    .toLowerCase()
    .replace(/[^a-z0-9_]/g, "_")
    .slice(0, 30);
  return /^[a-z_]/.test(safe) ? safe : `idem${safe ? `_${safe}` : ""}`;
})();

/**
 * Create an empty database on the real server, named `<DATABASE_PREFIX>_<label>_<random>`; `drop()`
 * removes it.
 */
export async function freshDatabase(label = "store"): Promise<{ url: string; drop(): Promise<void> }> {
  if (!DATABASE_URL) throw new Error("freshDatabase needs DATABASE_URL");
  const name = `${DATABASE_PREFIX}_${label}_${randomBytes(6).toString("hex")}`.slice(0, 63);
  const admin = new pg.Client({ connectionString: DATABASE_URL });
  await admin.connect();
  try {
    await admin.query(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  const url = new URL(DATABASE_URL);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    async drop() {
      const c = new pg.Client({ connectionString: DATABASE_URL });
      await c.connect();
      try {
        await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      } finally {
        await c.end();
      }
    },
  };
}

/**
 * The files of a fresh PGlite cluster, made once per test process. `PGlite.create()` runs initdb in
 * WebAssembly, 3.7 to 16 s on the loaded 2-core machine (what timed out the hooks of PGlite suites);
 * starting from these files takes 1.5 s and gives the same empty cluster.
 */
let freshCluster: Promise<Blob> | undefined;

/** A new, empty in-memory PGlite, as `PGlite.create()` makes it, started from the cached cluster. */
export async function newPglite(): Promise<PGlite> {
  freshCluster ??= (async () => {
    const first = await PGlite.create();
    try {
      return await first.dumpDataDir("none");
    } finally {
      await first.close();
    }
  })();
  freshCluster.catch(() => {
    freshCluster = undefined;
  });
  return PGlite.create({ loadDataDir: await freshCluster });
}

const pgliteBackend: TestBackend = {
  name: "pglite",
  async open() {
    const db = fromPglite(await newPglite());
    return { db, close: () => db.close() };
  },
};

const pgBackend: TestBackend = {
  name: "pg",
  async open() {
    const fresh = await freshDatabase();
    const pool = new pg.Pool({ connectionString: fresh.url, max: 20, pipeline: true } as pg.PoolConfig);
    // Without a listener, a pooled connection that dies (a restart, or `close()`'s DROP DATABASE ... FORCE
    // reaching a client still finishing a crashed consumer's work) would throw out of the test file;
    // the statements on it report their own errors. Services do the same (app/main.ts).
    pool.on("error", () => {});
    const db = fromPg(pool);
    return {
      db,
      url: fresh.url,
      async close() {
        await db.close();
        await fresh.drop();
      },
    };
  },
};

const postgresJsBackend: TestBackend = {
  name: "postgres",
  async open() {
    const fresh = await freshDatabase();
    const db = fromPostgresJs(postgres(fresh.url, { max: 20, onnotice: () => {} }));
    return {
      db,
      url: fresh.url,
      async close() {
        await db.close();
        await fresh.drop();
      },
    };
  },
};

/**
 * `npm run mutate` (vitest.mutation.config.ts) sets IDEM_MUTATION_BACKEND: the tests then run once per
 * mutant on that one backend only (the real server through `pg`), not once per driver.
 */
const only = process.env.IDEM_MUTATION_BACKEND;
const chosen = (list: TestBackend[]) => (only ? list.filter((b) => b.name === only) : list);

/** PGlite always; both real drivers when DATABASE_URL is set. */
export const backends: TestBackend[] = chosen(
  DATABASE_URL ? [pgliteBackend, pgBackend, postgresJsBackend] : [pgliteBackend],
);

/** Only the real-server backends (tests of concurrency that PGlite, being single-connection, cannot show). */
export const serverBackends: TestBackend[] = chosen(DATABASE_URL ? [pgBackend, postgresJsBackend] : []);
