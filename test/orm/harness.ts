/**
 * What every ORM integration must show on the real PostgreSQL, through a Hono app over HTTP whose
 * handler writes with the ORM only: a keyed request, its replay (the same bytes), a handler that throws
 * after its ORM write (nothing committed, and the retry runs), and 50 concurrent duplicates (one
 * execution). Each test file opens a database of its own.
 */
import { randomBytes, randomUUID } from "node:crypto";
import type { AddressInfo } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { serve } from "@hono/node-server";
import { type Context, Hono } from "hono";
import pg from "pg";
import { afterAll, beforeAll, expect, it } from "vitest";
import type { Db, Tx } from "../../src/core/index.ts";
import { idempotency } from "../../src/http/hono.ts";
import { NOTIFY_SQL } from "../../src/postgres/drivers/after-commit-notify.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { DATABASE_URL, freshDatabase } from "../helpers/db.ts";

export const PAYMENTS_DDL = `CREATE TABLE payments (id serial PRIMARY KEY, account text NOT NULL,
  amount_cents integer NOT NULL, currency text NOT NULL)`;

/** An ORM under test, on the database at `url`: idem's `Db` on it, and an insert written with the ORM. */
export interface OrmUnderTest {
  db: Db;
  /** Insert a payment through the ORM, in the request's transaction; returns its id. */
  insert(tx: Tx, p: { account: string; amountCents: number; currency: string }): Promise<number>;
}

export const hasServer = DATABASE_URL !== undefined;

export function ormContract(open: (url: string) => Promise<OrmUnderTest>): void {
  let fresh: Awaited<ReturnType<typeof freshDatabase>>;
  let orm: OrmUnderTest;
  let base: string;
  let server: ReturnType<typeof serve>;
  beforeAll(async () => {
    fresh = await freshDatabase("orm");
    orm = await open(fresh.url);
    await migrate(orm.db); // through the ORM too
    await orm.db.exec(PAYMENTS_DDL);
    const store = await PostgresStore.open(orm.db);
    // A short duplicate wait on a second route, to see the lock timeout answered 409 through the ORM.
    const impatient = await PostgresStore.open(orm.db, { lockTimeoutMs: 500 });
    const app = new Hono();
    const scope = (c: Context) => c.req.header("x-account");
    app.post("/v1/impatient", idempotency({ store: impatient, scope }), async (c) => {
      await sleep(Number(c.req.header("x-sleep-ms") ?? 0));
      return c.json({ ok: true }, 201);
    });
    app.post("/v1/payments", idempotency({ store, scope }), async (c) => {
      const { amount_cents, currency } = c.var.idempotency.body as { amount_cents: number; currency: string };
      const account = c.var.idempotency.scope!;
      const id = await orm.insert(c.var.idempotency.tx, { account, amountCents: amount_cents, currency });
      if (c.req.header("x-crash")) throw new Error("the handler crashed after its ORM write");
      // a fresh receipt on every execution: a replay that ran the handler again would show
      return c.json({ id, account, amount_cents, receipt: randomBytes(8).toString("hex") }, 201);
    });
    app.onError((_err, c) => c.json({ error: "crashed" }, 500));
    await new Promise<void>((resolve) => {
      server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, (info: AddressInfo) => {
        base = `http://127.0.0.1:${info.port}`;
        resolve();
      });
    });
  }, 60_000);
  afterAll(async () => {
    await new Promise<void>((done) => (server ? server.close(() => done()) : done()));
    await orm?.db.close();
    await fresh?.drop();
  });

  const post = (acct: string, key: string, headers: Record<string, string> = {}, path = "/v1/payments") =>
    fetch(base + path, {
      method: "POST",
      headers: { "content-type": "application/json", "x-account": acct, "idempotency-key": key, ...headers },
      body: JSON.stringify({ amount_cents: 5000, currency: "eur" }),
    });
  const count = async (sql: string, acct: string) =>
    (await orm.db.query<{ n: number }>(sql, [acct])).rows[0]!.n;
  const rows = (acct: string) => count("SELECT count(*)::int AS n FROM payments WHERE account = $1", acct);
  const keys = (acct: string) => count("SELECT count(*)::int AS n FROM idem.keys WHERE scope = $1", acct);
  const account = () => `acct_${randomBytes(6).toString("hex")}`;

  it("runs a keyed request once and replays the same bytes", async () => {
    const acct = account();
    const key = randomUUID();
    const first = await post(acct, key);
    const body = await first.text();
    expect(first.status).toBe(201);
    expect(first.headers.get("idempotent-replayed")).toBeNull();
    const retry = await post(acct, key);
    expect(retry.status).toBe(201);
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(await retry.text()).toBe(body);
    expect(await rows(acct)).toBe(1);
    expect(await keys(acct)).toBe(1);
  });

  it("commits nothing when the handler throws after its ORM write, and the retry runs", async () => {
    const acct = account();
    const key = randomUUID();
    const crash = await post(acct, key, { "x-crash": "1" });
    expect(crash.status).toBe(500);
    expect(await rows(acct)).toBe(0);
    expect(await keys(acct)).toBe(0);
    const retry = await post(acct, key);
    expect(retry.status).toBe(201);
    expect(retry.headers.get("idempotent-replayed")).toBeNull();
    expect(await rows(acct)).toBe(1);
  });

  it("runs 50 concurrent duplicates once, and all of them get the same body", async () => {
    const acct = account();
    const key = randomUUID();
    const replies = await Promise.all(
      Array.from({ length: 50 }, async () => {
        const res = await post(acct, key);
        return { status: res.status, body: await res.text() };
      }),
    );
    expect(replies.map((r) => r.status)).toEqual(Array(50).fill(201));
    expect(new Set(replies.map((r) => r.body)).size).toBe(1);
    expect(await rows(acct)).toBe(1);
  }, 60_000);
  it("answers a duplicate that outwaits the lock 409 problem+json (the driver's SQLSTATE reaches idem)", async () => {
    const acct = account();
    const key = randomUUID();
    const slow = post(acct, key, { "x-sleep-ms": "2000" }, "/v1/impatient");
    await sleep(300);
    const dup = await post(acct, key, {}, "/v1/impatient");
    expect(dup.status).toBe(409);
    expect(dup.headers.get("content-type")).toBe("application/problem+json");
    expect((await dup.json()).type).toBe("urn:idem:problem:idempotency-key-in-flight");
    expect((await slow).status).toBe(201);
  });

  it("wakes relays after the ORM's commit: shared NOTIFYs, none from a rollback, none from inside", async () => {
    const listener = new pg.Client({ connectionString: fresh.url });
    await listener.connect();
    const heard: string[] = [];
    listener.on("notification", (n) => heard.push(n.channel));
    await listener.query("LISTEN idem_outbox");
    const write = (topic: string, fail = false) =>
      orm.db.transaction(async (tx) => {
        await writeOutbox(tx, { topic, type: "payment.succeeded", payload: { cents: 1 } });
        if (fail) throw new Error("rolled back");
        // What the outbox's trigger reads to send nothing from inside this transaction (sql/0015).
        return (await tx.query<{ wake: string }>("SELECT current_setting('idem.outbox_wake', true) AS wake"))
          .rows[0]!.wake;
      });
    const settle = () => sleep(300);
    try {
      // The statement the Db sends after a commit (a failure there is dropped: relays also poll).
      await expect(orm.db.query(NOTIFY_SQL, ["idem_outbox"])).resolves.toBeDefined();
      expect(await write("orm-notify")).toBe("after-commit");
      await settle();
      heard.length = 0;
      // 40 at once: a NOTIFY from inside each transaction (the trigger's way) would be 40.
      await Promise.all(Array.from({ length: 40 }, () => write("orm-notify")));
      await settle();
      expect(heard.length).toBeGreaterThanOrEqual(1);
      expect(heard.length).toBeLessThan(40);
      heard.length = 0;
      await expect(write("orm-notify", true)).rejects.toThrow("rolled back");
      await settle();
      expect(heard).toEqual([]);
      // Without the trigger, only the NOTIFY sent after the commit can wake anybody.
      await migrate(orm.db, { outboxNotify: false });
      await write("orm-notify");
      await until(() => heard.length > 0);
      expect(heard).toEqual(["idem_outbox"]);
    } finally {
      await migrate(orm.db, { outboxNotify: true });
      await listener.end();
    }
  });
}

async function until(done: () => boolean, ms = 3_000): Promise<void> {
  const end = Date.now() + ms;
  while (!done()) {
    if (Date.now() > end) throw new Error(`not within ${ms} ms`);
    await sleep(20);
  }
}
