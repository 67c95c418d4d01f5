/**
 * A handler that keeps its transaction past its return (or fires a statement without awaiting it):
 * with a pool of ONE connection, request A's late INSERT would run on the connection request B then
 * holds, inside B's transaction. The transaction handed to user code is fenced: the late use fails at
 * once with TransactionEndedError, naming why, and nothing of A reaches B. On pg and postgres.js, for
 * atomic routes, unkeyed transactions, phases' local transactions and the ORM adapters.
 */
import { drizzle } from "drizzle-orm/node-postgres";
import pg from "pg";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isTransactionEndedError, type Tx } from "../../src/core/index.ts";
import { fromDrizzle } from "../../src/orm/drizzle.ts";
import type { Db } from "../../src/postgres/db.ts";
import { fromPg } from "../../src/postgres/drivers/pg.ts";
import { fromPostgresJs } from "../../src/postgres/drivers/postgres-js.ts";
import { definePhases, jsonResponse } from "../../src/postgres/phases/index.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { paymentClaim } from "../helpers/claim.ts";
import { DATABASE_URL, freshDatabase } from "../helpers/db.ts";

const enc = new TextEncoder();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const drivers = [
  {
    name: "pg",
    open: (url: string): Db => {
      const pool = new pg.Pool({ connectionString: url, max: 1, pipeline: true } as pg.PoolConfig);
      pool.on("error", () => {}); // the DROP DATABASE at the end cuts its idle connection
      return fromPg(pool);
    },
  },
  {
    name: "postgres.js",
    open: (url: string): Db => fromPostgresJs(postgres(url, { max: 1, onnotice: () => {} })),
  },
];

describe.runIf(DATABASE_URL).each(drivers)(
  "a transaction kept past the handler, $name, pool of one",
  (driver) => {
    let fresh: Awaited<ReturnType<typeof freshDatabase>>;
    let db: Db;
    let store: PostgresStore;

    beforeAll(async () => {
      fresh = await freshDatabase();
      db = driver.open(fresh.url);
      await migrate(db);
      await db.exec("CREATE TABLE notes (id serial PRIMARY KEY, who text NOT NULL)");
      store = await PostgresStore.open(db);
    });
    afterAll(async () => {
      await db?.close();
      await fresh?.drop();
    });

    const notes = async (who: string) =>
      Number(
        (await db.query<{ n: number }>("SELECT count(*)::int AS n FROM notes WHERE who = $1", [who])).rows[0]!
          .n,
      );
    const reply = { status: 201, headers: [] as Array<[string, string]>, body: enc.encode("{}") };

    /**
     * A runs and leaks its tx: a write 30 ms after it returned. B starts at once on the one connection,
     * holds its transaction 150 ms, and rolls back (a 503, not saved). A's late write must not be in
     * B's transaction, nor anywhere.
     */
    async function race(run: (who: string, work: (tx: Tx) => Promise<void>) => Promise<unknown>) {
      let late: Promise<unknown> | undefined;
      await run("A", async (tx) => {
        await tx.query("INSERT INTO notes (who) VALUES ('A')");
        late = sleep(30).then(() => tx.query("INSERT INTO notes (who) VALUES ('A-late')"));
        late.catch(() => {});
      });
      await run("B", async (tx) => {
        await tx.query("INSERT INTO notes (who) VALUES ('B')");
        await sleep(150);
      });
      const err = await late!.then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(isTransactionEndedError(err), String(err)).toBe(true);
      expect((err as Error).message).toMatch(/transaction has ended/);
      expect(await notes("A-late")).toBe(0);
    }

    it("atomic mode: the late write fails at once and never lands in the next request's transaction", async () => {
      await race(async (who, work) =>
        store.atomic(paymentClaim("acct", `${who}-${Date.now()}`, "{}"), async (tx) => {
          await work(tx);
          // A is saved (201); B answers 503: not saved, its transaction rolls back.
          const r = who === "A" ? reply : { ...reply, status: 503 };
          return { response: r, save: r.status === 201 ? r : undefined };
        }),
      );
      expect(await notes("A")).toBe(1);
      expect(await notes("B")).toBe(0);
    });

    it("a plain (unkeyed) transaction is fenced the same way", async () => {
      await race(async (who, work) =>
        store
          .transaction(async (tx) => {
            await work(tx);
            if (who === "B") throw new Error("roll B back");
          })
          .catch(() => {}),
      );
    });

    it("a local phase's transaction is fenced too", async () => {
      let n = 0;
      const runner = (who: string, work: (tx: Tx) => Promise<void>) =>
        definePhases<unknown, Record<string, unknown>>({
          store,
          name: `leak-${who}`,
          answerWithinMs: Number.POSITIVE_INFINITY,
          phases: {
            only: {
              local: async (_ctx, tx) => {
                await work(tx);
                return { response: jsonResponse(who === "A" ? 201 : 503, {}) };
              },
            },
          },
        }).run(paymentClaim("acct", `phase-${who}-${n++}`, "{}"), {});
      await race(runner);
    });

    it("the ORM's transaction object (Drizzle) is fenced: reading it after the handler throws", async () => {
      if (driver.name !== "pg") return; // Drizzle here runs on node-postgres
      const pool = new pg.Pool({ connectionString: fresh.url, max: 1 });
      pool.on("error", () => {}); // pg-pool's end() resolves before its connection closes: the DROP cuts it
      const idemDb = fromDrizzle(drizzle(pool));
      try {
        const s = await PostgresStore.open(idemDb);
        let kept: unknown;
        await s.atomic(paymentClaim("acct", `orm-${Date.now()}`, "{}"), async (tx) => {
          kept = idemDb.tx(tx);
          return { response: reply, save: reply };
        });
        const err = (() => {
          try {
            (kept as { execute: unknown }).execute;
          } catch (e) {
            return e;
          }
        })();
        expect(isTransactionEndedError(err)).toBe(true);
      } finally {
        await idemDb.close();
      }
    });
  },
);
