/**
 * What the store does with pooled connections (real server, node-postgres): a handler's 4xx never costs
 * a server session, a dead connection is dropped, and duplicates waiting for a key hold no connection.
 */
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Claim, fingerprint } from "../../src/core/index.ts";
import type { Db } from "../../src/postgres/db.ts";
import { fromPg } from "../../src/postgres/drivers/pg.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { DATABASE_URL, freshDatabase, sayWhySkippedWithoutServer } from "../helpers/db.ts";

sayWhySkippedWithoutServer();

const enc = new TextEncoder();

function claimOf(scope: string, key: string): Claim {
  return {
    scope,
    key,
    fingerprint: fingerprint({
      method: "POST",
      path: "/v1/refunds",
      contentType: "application/json",
      body: enc.encode("{}"),
    }),
  };
}

describe.skipIf(!DATABASE_URL)("pooled connections on the real server (pg)", () => {
  let fresh: Awaited<ReturnType<typeof freshDatabase>>;
  let db: Db;
  let store: PostgresStore;
  const POOL = 5;

  beforeAll(async () => {
    fresh = await freshDatabase();
    const pool = new pg.Pool({
      connectionString: fresh.url,
      max: POOL,
      pipeline: true,
      idleTimeoutMillis: 0, // a connection closed for idling would count as a new session
    } as pg.PoolConfig);
    pool.on("error", () => {});
    db = fromPg(pool);
    await migrate(db);
    store = await PostgresStore.open(db);
  });
  afterAll(async () => {
    await db?.close();
    await fresh?.drop();
  });

  /** The server sessions of this test's own database. */
  const sessions = async () =>
    (
      await db.query<{ pid: number }>(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'",
      )
    ).rows.map((r) => r.pid);

  it("keeps the connection when a handler throws a 4xx: 2,000 of them open no new session", async () => {
    // Fill the pool, so every later transaction reuses one of its connections.
    await Promise.all(
      Array.from({ length: POOL }, () => db.transaction((tx) => tx.query("SELECT pg_sleep(0.05)"))),
    );
    const before = await sessions();
    const seen = new Set<number>();
    const notFound = { status: 404, title: "no such payment" }; // thrown as a plain object, without `code`
    let rejected = 0;
    for (let round = 0; round < 400; round++) {
      await Promise.all(
        Array.from({ length: POOL }, (_, i) =>
          store
            .atomic(claimOf("acct_1", `refund-${round}-${i}`), async (tx) => {
              const { rows } = await tx.query<{ pid: number }>("SELECT pg_backend_pid() AS pid");
              seen.add(rows[0]!.pid);
              throw notFound;
            })
            .catch((e) => {
              if (e === notFound) rejected++;
            }),
        ),
      );
    }
    const after = await sessions();
    console.log(
      `4xx transactions: ${rejected}; server sessions used: ${seen.size}; before ${before.length}, after ${after.length}`,
    );
    expect(rejected).toBe(2_000);
    expect(seen.size).toBeLessThanOrEqual(POOL);
    expect([...seen].every((pid) => before.includes(pid))).toBe(true);
    expect(after.sort()).toEqual(before.sort());
  });

  it("a storm of duplicates of a slow key holds no connection: another account keeps its latency", async () => {
    // Two stores on one pool stand for two service processes: each has its own in-memory waits.
    const [one, two] = [store, await PostgresStore.open(db)];
    const c = claimOf("acct_storm", "slow-key");
    let runs = 0;
    const slow = async (tx: Parameters<Parameters<PostgresStore["atomic"]>[1]>[0]) => {
      runs++;
      await tx.query("SELECT pg_sleep(2)");
      const reply = { status: 201, headers: [] as [string, string][], body: enc.encode('{"id":1}') };
      return { response: reply, save: reply };
    };
    /** Another account's plain reads, one after the other, for `ms`: their latencies. */
    const otherAccount = async (ms: number) => {
      const lat: number[] = [];
      for (const end = Date.now() + ms; Date.now() < end; ) {
        const t = performance.now();
        await db.query("SELECT count(*) FROM idem.keys WHERE scope = 'acct_other'");
        lat.push(performance.now() - t);
        await new Promise((r) => setTimeout(r, 5));
      }
      return lat.sort((a, b) => a - b);
    };
    const fig = (l: number[]) =>
      `p50 ${l[Math.floor(l.length / 2)]!.toFixed(1)} ms, max ${l[l.length - 1]!.toFixed(1)} ms (${l.length} queries)`;

    const quiet = await otherAccount(1_500);
    const first = one.atomic(c, slow);
    await new Promise((r) => setTimeout(r, 50));
    const storm = Array.from({ length: 120 }, (_, i) => (i % 2 ? two : one).atomic(c, slow));
    const during = await otherAccount(1_500);
    const outs = await Promise.all([first, ...storm]);
    console.log(
      `other account without the storm: ${fig(quiet)}; during 120 duplicates of a 2 s key on a pool of ${POOL}: ${fig(during)}`,
    );
    expect(runs).toBe(1);
    expect(outs.filter((o) => o.kind === "executed")).toHaveLength(1);
    expect(outs.filter((o) => o.kind === "replayed")).toHaveLength(120);
    // Loose: starved, every read would wait for the 2 s work to give a connection back.
    expect(during[Math.floor(during.length / 2)]!).toBeLessThan(1_000);
  });

  it("drops a connection that died, and the next transactions run on a new one", async () => {
    let victim = 0;
    const err = await db
      .transaction(async (tx) => {
        victim = (await tx.query<{ pid: number }>("SELECT pg_backend_pid() AS pid")).rows[0]!.pid;
        // Another session kills this one, as a server restart or a proxy would.
        const killer = new pg.Client({ connectionString: fresh.url });
        await killer.connect();
        try {
          await killer.query("SELECT pg_terminate_backend($1)", [victim]);
        } finally {
          await killer.end();
        }
        await tx.query("SELECT 1");
      })
      .catch((e) => e);
    expect(err).toBeInstanceOf(Error);
    const pids = await Promise.all(
      Array.from({ length: POOL * 2 }, () =>
        db.transaction(
          async (tx) => (await tx.query<{ pid: number }>("SELECT pg_backend_pid() AS pid")).rows[0]!.pid,
        ),
      ),
    );
    expect(pids).not.toContain(victim);
  });
});
