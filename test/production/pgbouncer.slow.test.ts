/**
 * idem through PgBouncer in transaction pooling mode (Debian's pgbouncer, started here in front of the
 * test server, torn down after): the HTTP protocol suite on both drivers, the reference service with 50
 * concurrent duplicates of one key in atomic and phases modes, and the outbox relay publishing through
 * it. Nothing is configured for the pooler: the drivers find it on their first connection.
 */
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import pg from "pg";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MemoryBroker } from "../../src/messaging/memory.ts";
import { Relay } from "../../src/messaging/relay.ts";
import { DatabaseConnectError, openDatabaseUrl } from "../../src/postgres/drivers/connect.ts";
import { ListenUnavailableError, listenWithPg } from "../../src/postgres/drivers/listen.ts";
import { fromPg } from "../../src/postgres/drivers/pg.ts";
import { CommitRolledBackError, fromPostgresJs } from "../../src/postgres/drivers/postgres-js.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { SingleStatementStore, type StatementSpec } from "../../src/postgres/statement/store.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { pay, startService } from "../app/service.ts";
import { paymentClaim } from "../helpers/claim.ts";
import { DATABASE_URL, freshDatabase, type TestBackend } from "../helpers/db.ts";
import { paymentsContract, useApp } from "../http/contract.ts";
import { lifecycleContract } from "../http/contract-lifecycle.ts";
import { startHono } from "../http/hono-app.ts";
import { missing } from "../infra/common.ts";
import { type PgBouncer, startPgBouncer } from "../infra/pgbouncer.ts";

/** The installed postgres.js's major version (the repository tests with 4.1; its peer range admits 3.4). */
const POSTGRES_JS_MAJOR = Number(
  JSON.parse(
    readFileSync(new URL("../../node_modules/postgres/package.json", import.meta.url), "utf8"),
  ).version.split(".")[0],
);

const why = DATABASE_URL ? missing({ pgbouncer: ["pgbouncer"] }) : "no DATABASE_URL";

let bouncer: PgBouncer;
beforeAll(async () => {
  if (why) return;
  const server = new URL(DATABASE_URL!);
  bouncer = await startPgBouncer({ server: `${server.hostname}:${server.port || 5432}`, poolSize: 8 });
});
afterAll(async () => {
  await bouncer?.stop();
});

/** A fresh database on the test server, reached through the pooler. */
function through(name: "pg" | "postgres"): TestBackend {
  return {
    name,
    async open() {
      const fresh = await freshDatabase("bouncer");
      const url = bouncer.url(new URL(fresh.url).pathname.slice(1));
      let db: Awaited<ReturnType<TestBackend["open"]>>["db"];
      if (name === "pg") {
        const pool = new pg.Pool({ connectionString: url, max: 20, pipeline: true } as pg.PoolConfig);
        pool.on("error", () => {});
        db = fromPg(pool);
      } else {
        db = fromPostgresJs(postgres(url, { max: 20, onnotice: () => {} }));
      }
      return {
        db,
        url,
        async close() {
          await db.close();
          await fresh.drop();
        },
      };
    },
  };
}

describe.skipIf(why)("through PgBouncer in transaction mode", () => {
  describe.each(["pg", "postgres"] as const)("the protocol suite on %s", (name) => {
    const app = useApp(through(name), startHono);
    paymentsContract(app, { hangUp: true });
    lifecycleContract(app);
  });

  it("commits a postgres.js transaction on another server session than the last one", async () => {
    // postgres.js prepares its own COMMIT under a name once per connection (the instance's `prepare`,
    // true by default) and then only binds it. Through the pooler, a transaction on another server
    // session binds a name that does not exist there: 26000 aborts it, postgres.js retries the COMMIT,
    // and PostgreSQL answers it with ROLLBACK and no error, so `sql.begin` resolves and nothing was
    // written. Seen as the protocol suite's flaky 201s whose rows were missing. fromPostgresJs runs its
    // transactions on a reserved connection with BEGIN and COMMIT as simple queries instead.
    const fresh = await freshDatabase("bouncer");
    const url = bouncer.url(new URL(fresh.url).pathname.slice(1));
    const sql = postgres(url, { max: 1, onnotice: () => {} }); // prepare: true, the default
    const db = fromPostgresJs(sql, { owned: false });
    const holders: pg.Client[] = [];
    const pidOf = async (run: (insert: string) => Promise<unknown[]>) =>
      Number(((await run("INSERT INTO t VALUES (pg_backend_pid()) RETURNING n")) as { n: number }[])[0]!.n);
    /** Keep the server session `pid` in a transaction of another client: the next one runs elsewhere. */
    const pin = async (pid: number) => {
      for (let i = 0; i < 8; i++) {
        const c = new pg.Client({ connectionString: url });
        await c.connect();
        holders.push(c);
        await c.query("BEGIN");
        if ((await c.query("SELECT pg_backend_pid() AS pid")).rows[0].pid === pid) return;
      }
      throw new Error(`could not pin server session ${pid}`);
    };
    const count = async () => Number((await sql`SELECT count(*)::int AS n FROM t`)[0]!.n);
    try {
      await sql`CREATE TABLE t (n int)`;
      // postgres.js's own transactions: the second, on another session, answers and is not there.
      const first = await pidOf((insert) => sql.begin((tx) => tx.unsafe(insert)));
      await pin(first);
      const second = await pidOf((insert) => sql.begin((tx) => tx.unsafe(insert)));
      expect(second).not.toBe(first);
      // postgres.js 3: the second COMMIT was a rollback (3.4.9). 4.1 no longer loses it; either way
      // the adapter's below must keep both.
      const kept = await count();
      expect(kept).toBe(POSTGRES_JS_MAJOR === 3 ? 1 : 2);
      await Promise.all(holders.splice(0).map((c) => c.end()));

      // The adapter's, the same way: both are written.
      const third = await pidOf(async (insert) =>
        db.transaction(async (tx) => (await tx.query(insert)).rows),
      );
      await pin(third);
      const fourth = await pidOf(async (insert) =>
        db.transaction(async (tx) => (await tx.query(insert)).rows),
      );
      expect(fourth).not.toBe(third);
      expect(await count()).toBe(kept + 2);
    } finally {
      await Promise.all(holders.map((c) => c.end()));
      await sql.end({ timeout: 5 });
      await fresh.drop();
    }
  });

  it("refuses to report a postgres.js transaction committed that PostgreSQL rolled back", async () => {
    const fresh = await freshDatabase("bouncer");
    const db = fromPostgresJs(
      postgres(bouncer.url(new URL(fresh.url).pathname.slice(1)), { onnotice: () => {} }),
    );
    try {
      await db.exec("CREATE TABLE t (n int PRIMARY KEY)");
      const err = await db
        .transaction(async (tx) => {
          await tx.query("INSERT INTO t VALUES (1)");
          await tx.query("INSERT INTO t VALUES (1)").catch(() => {}); // 23505, caught: the transaction is aborted
          return "done";
        })
        .catch((e) => e);
      expect(err).toBeInstanceOf(CommitRolledBackError);
      expect(err.cause?.code).toBe("23505");
      expect((await db.query<{ n: number }>("SELECT count(*)::int AS n FROM t")).rows[0]!.n).toBe(0);
    } finally {
      await db.close();
      await fresh.drop();
    }
  });

  // Single-statement mode sends one autocommitted statement per attempt, under texts that change with
  // the partitions they name: unnamed through the pooler, as every statement there.
  it.each(["pg", "postgres"] as const)(
    "runs a single statement once under 30 duplicates from three stores on %s, and replays it",
    async (name) => {
      const open = await through(name).open();
      try {
        await migrate(open.db);
        await open.db.exec("CREATE TABLE payments (id serial PRIMARY KEY, note text NOT NULL)");
        const stores = await Promise.all(
          [1, 2, 3].map(async () => new SingleStatementStore(await PostgresStore.open(open.db))),
        );
        const spec: StatementSpec = {
          sql: "INSERT INTO payments (note) SELECT $1 FROM idem_claim RETURNING id, note",
          params: ["bouncer"],
        };
        const claim = paymentClaim("acct_1", randomUUID(), "{}");
        const outs = await Promise.all(
          Array.from({ length: 30 }, (_, i) => stores[i % 3]!.runStatement(claim, spec)),
        );
        expect(outs.filter((o) => o.kind === "executed")).toHaveLength(1);
        const body = Buffer.from(outs.find((o) => o.kind === "executed")!.response.body).toString();
        for (const o of outs) expect(Buffer.from(o.response.body).toString()).toBe(body);
        const again = await stores[2]!.runStatement(claim, spec);
        expect(again.kind).toBe("replayed");
        const { rows } = await open.db.query<{ n: number }>("SELECT count(*)::int AS n FROM payments");
        expect(rows[0]!.n).toBe(1);
      } finally {
        await open.close();
      }
    },
    60_000,
  );

  describe.each(["atomic", "phases"] as const)("the reference service in %s mode", (mode) => {
    it("answers 50 concurrent duplicates of one key with one payment and no 5xx", async () => {
      const svc = await startService(through("pg"), { paymentsMode: mode });
      try {
        const key = randomUUID();
        const replies = await Promise.all(Array.from({ length: 50 }, () => pay(svc.url, { key })));
        const statuses = replies.map((r) => r.status);
        expect(statuses.filter((s) => s >= 500)).toEqual([]);
        // Atomic: every duplicate waits and replays. Phases: the others are told 409 in flight.
        expect(statuses.every((s) => s === 201 || (mode === "phases" && s === 409))).toBe(true);
        const ids = new Set(
          await Promise.all(replies.filter((r) => r.status === 201).map(async (r) => (await r.json()).id)),
        );
        expect(ids.size).toBe(1);
        expect(await svc.count("SELECT count(*) AS n FROM payments")).toBe(1);
        // A retry after they settle replays the one payment.
        let again = await pay(svc.url, { key });
        for (let i = 0; again.status === 409 && i < 50; i++) {
          await new Promise((r) => setTimeout(r, 200));
          again = await pay(svc.url, { key });
        }
        expect(again.status).toBe(201);
        expect(again.headers.get("idempotent-replayed")).toBe("true");
        expect((await again.json()).id).toBe([...ids][0]);
      } finally {
        await svc.stop();
      }
    }, 60_000);
  });

  it("relays the outbox through it, saying LISTEN is unavailable and polling", async () => {
    const fresh = await freshDatabase("bouncer");
    const url = bouncer.url(new URL(fresh.url).pathname.slice(1));
    const opened = await openDatabaseUrl(url);
    const errors: Error[] = [];
    const broker = new MemoryBroker();
    const relay = new Relay({
      db: opened.db,
      publisher: broker.publisher(),
      listen: opened.listen,
      onError: (e) => errors.push(e),
    });
    try {
      await migrate(opened.db);
      await relay.start();
      expect(errors[0]?.cause).toBeInstanceOf(ListenUnavailableError);
      expect(errors[0]?.message).toMatch(
        /LISTEN is unavailable through a connection pooler.*polling every 500 ms/,
      );
      for (let i = 0; i < 20; i++) {
        await opened.db.transaction(async (tx) => {
          await writeOutbox(tx, { topic: "receipts", type: "receipt", payload: { n: i } });
        });
      }
      for (let i = 0; i < 100 && relay.stats.published < 20; i++)
        await new Promise((r) => setTimeout(r, 100));
      expect(relay.stats.published).toBe(20);
    } finally {
      await relay.stop();
      await opened.db.close();
      await fresh.drop();
    }
  });

  it("a LISTEN connection checked out of the pooled pool is refused, not left deaf", async () => {
    const pool = new pg.Pool({ connectionString: bouncer.url("postgres"), max: 2 });
    pool.on("error", () => {});
    try {
      await expect(listenWithPg(() => pool.connect())("idem_outbox", () => {})).rejects.toBeInstanceOf(
        ListenUnavailableError,
      );
    } finally {
      await pool.end();
    }
  });

  it("says the pooler answered, not that PostgreSQL cannot be reached", async () => {
    const err = await openDatabaseUrl(bouncer.url("postgres", "nobody")).catch((e) => e);
    expect(err).toBeInstanceOf(DatabaseConnectError);
    expect(err.kind).toBe("pooler");
    expect(err.message).toMatch(
      /^the connection pooler at 127\.0\.0\.1:\d+\/postgres answered, not PostgreSQL/,
    );
    expect(err.message).not.toMatch(/cannot reach/);
  });
});
