/**
 * The node-postgres adapter's statement path (src/postgres/drivers/pg.ts): it builds node-postgres'
 * own Query objects instead of passing a config object (which node-postgres copies on every call), and
 * falls back to the config path on a client whose Query class it does not recognise. Both paths must
 * answer the same: rows, rowCount, bytea parameters, errors, named statements or none.
 */
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import type { Db } from "../../src/postgres/db.ts";
import { fromPg } from "../../src/postgres/drivers/pg.ts";
import { DATABASE_URL, sayWhySkippedWithoutServer } from "../helpers/db.ts";

sayWhySkippedWithoutServer();

/** A client whose Query class the adapter does not recognise (as pg-native's, or a future pg's). */
class UnknownQueryClient extends pg.Client {
  static Query = undefined;
}

const poolOf = (Client?: typeof pg.Client, extra: Partial<pg.PoolConfig> = {}) => {
  const pool = new pg.Pool({
    connectionString: DATABASE_URL,
    max: 1,
    ...(Client ? { Client } : {}),
    ...extra,
  });
  pool.on("error", () => {});
  return pool;
};

/** What one Db answers to the statements idem sends, in a form two Dbs can be compared by. */
async function answers(db: Db) {
  const out: unknown[] = [];
  const bytes = new Uint8Array([0, 1, 2, 254, 255]);
  out.push(await db.query("SELECT $1::bytea AS b, $2::text AS t, $3::int AS n", [bytes, "x", 7]));
  out.push(await db.query("SELECT 1 AS one WHERE false"));
  await db.transaction(async (tx) => {
    await tx.exec("CREATE TEMP TABLE t (id int PRIMARY KEY, b bytea) ON COMMIT DROP");
    out.push(await tx.query("INSERT INTO t VALUES (1, $1), (2, $1), (3, NULL)", [bytes]));
    out.push(await tx.query("UPDATE t SET b = $1 WHERE id > $2", [new Uint8Array([9]), 1]));
    out.push(await tx.query("SELECT id, b FROM t ORDER BY id"));
    out.push(await tx.query("DELETE FROM t WHERE id = $1 RETURNING id", [3]));
    const dup = await tx.query("INSERT INTO t VALUES (1, NULL)").catch((e: unknown) => e);
    out.push(dup);
  });
  out.push(await db.query("SELECT * FROM nowhere").catch((e: unknown) => e));
  out.push(await db.query("SELECT $1::int", ["not a number"]).catch((e: unknown) => e));
  return out.map((a) => {
    if (a instanceof Error) {
      const e = a as Error & { code?: string; severity?: string };
      return { error: e.constructor.name, message: e.message, code: e.code, severity: e.severity };
    }
    const r = a as { rows: unknown[]; rowCount: number };
    return { keys: Object.keys(r).sort(), rows: r.rows, rowCount: r.rowCount };
  });
}

describe.skipIf(!DATABASE_URL)("node-postgres adapter: statement path (real server)", () => {
  const pools: pg.Pool[] = [];
  const dbOf = (pool: pg.Pool, prepare: boolean | "auto") => {
    pools.push(pool);
    return fromPg(pool, { prepare, owned: false });
  };
  beforeAll(() => {});
  afterAll(async () => {
    await Promise.all(pools.map((p) => p.end()));
  });

  it("hands node-postgres its own Query objects, named when preparing", async () => {
    const db = dbOf(poolOf(), true);
    const spy = vi.spyOn(pg.Client.prototype, "query");
    try {
      await db.query("SELECT $1::int AS n -- pg-driver test", [1]);
      const args = spy.mock.calls.map((c) => c[0]).filter((a) => typeof a !== "string");
      expect(args).toHaveLength(1);
      // If this fails after a pg upgrade, the adapter took the config path: still correct, but each
      // statement costs node-postgres a config copy again (see `submitterFor` in drivers/pg.ts).
      expect(args[0]).toBeInstanceOf(pg.Query);
      expect((args[0] as unknown as { name?: string }).name).toMatch(/^idem_[0-9a-f]{16}$/);
    } finally {
      spy.mockRestore();
    }
  });

  it("answers the same through node-postgres' Query and through the config path", async () => {
    for (const prepare of [true, false]) {
      const fast = await answers(dbOf(poolOf(), prepare));
      const config = await answers(dbOf(poolOf(UnknownQueryClient), prepare));
      expect(fast).toEqual(config);
      expect(fast[0]).toEqual({
        keys: ["rowCount", "rows"],
        rows: [{ b: Buffer.from([0, 1, 2, 254, 255]), t: "x", n: 7 }],
        rowCount: 1,
      });
      expect(fast.slice(2, 6).map((a) => (a as { rowCount: number }).rowCount)).toEqual([3, 2, 3, 1]);
      expect(fast[6]).toMatchObject({ error: "DatabaseError", code: "23505" });
      expect(fast[7]).toMatchObject({ error: "DatabaseError", code: "42P01" });
      expect(fast[8]).toMatchObject({ error: "DatabaseError", code: "22P02" });
    }
  });

  it("prepares named statements only when asked, on either path", async () => {
    for (const Client of [undefined, UnknownQueryClient]) {
      for (const prepare of [true, false]) {
        const db = dbOf(poolOf(Client), prepare);
        const text = `SELECT $1::text AS v -- ${prepare} ${Client ? "config" : "query"}`;
        expect((await db.query(text, ["a"])).rows).toEqual([{ v: "a" }]);
        expect((await db.query(text, ["b"])).rows).toEqual([{ v: "b" }]);
        const { rows } = await db.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM pg_prepared_statements WHERE statement = $1",
          [text],
        );
        expect(rows[0]!.n).toBe(prepare ? 1 : 0);
      }
    }
  });

  it("keeps node-postgres' query_timeout and its errors' stack", async () => {
    const db = dbOf(poolOf(undefined, { query_timeout: 100 }), true);
    const err = (await db.query("SELECT pg_sleep(2)").catch((e: unknown) => e)) as Error;
    expect(err.message).toBe("Query read timeout");
    const dbErr = (await db.query("SELECT * FROM nowhere_either").catch((e: unknown) => e)) as Error;
    expect(dbErr).toBeInstanceOf(pg.DatabaseError);
    expect(dbErr.stack).not.toMatch(/onStreamRead|pg-protocol/);
    expect(dbErr.stack).toMatch(/pg-driver\.test\.ts/); // async frames back to this test
  });

  it("does not send a caller's array changed after the call", async () => {
    const db = dbOf(poolOf(), true);
    await db.transaction(async (tx) => {
      const params: unknown[] = ["first"];
      const q = tx.query<{ v: string }>("SELECT $1::text AS v", params);
      params[0] = "changed";
      expect((await q).rows).toEqual([{ v: "first" }]);
    });
  });

  it("queues no statement behind another on a client without pipeline (deprecated since pg 8.19)", async () => {
    // node-postgres warns ("Calling client.query() when the client is already executing a query is
    // deprecated") when a query is added while another waits in its queue; it warns once per process,
    // so the test reads the queue itself at every call.
    const queued: number[] = [];
    const original = pg.Client.prototype.query;
    const spy = vi.spyOn(pg.Client.prototype, "query").mockImplementation(function (
      this: pg.Client & { _queryQueue: unknown[] },
      ...args: unknown[]
    ) {
      queued.push(this._queryQueue.length);
      return original.apply(this, args as never);
    } as never);
    try {
      const db = dbOf(poolOf(), true);
      const out = await db.transaction(
        async (tx) => {
          // Statements sent together: the lock's, a handler's two at once, and the last before COMMIT.
          const [a, b] = await Promise.all([
            tx.query<{ v: number }>("SELECT $1::int AS v", [1]),
            tx.query<{ v: number }>("SELECT $1::int AS v", [2]),
          ]);
          tx.final("SELECT $1::int AS v", [3]);
          return [a.rows[0]!.v, b.rows[0]!.v];
        },
        {
          before: { sql: "SELECT $1::int AS v", params: [0] },
          begin: { sql: "SELECT pg_advisory_xact_lock($1)", params: [42] },
        },
      );
      expect(out).toEqual([1, 2]);
      expect(queued.length).toBeGreaterThanOrEqual(7); // before, BEGIN, lock, two, final, COMMIT
      expect(Math.max(...queued)).toBe(0);
    } finally {
      spy.mockRestore();
    }
  });
});
