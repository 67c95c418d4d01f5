/**
 * Sharding by scope over two real PostgreSQL databases: an account's keys and effects live and commit
 * together in its shard, and a retry always finds its key. Real server only (two databases).
 */
import { type Context, Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { idempotency } from "../../src/http/hono.ts";
import type { Db } from "../../src/postgres/db.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { hashRoute, ShardedStore, UnknownShardError } from "../../src/postgres/sharded.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { type OpenDb, sayWhySkippedWithoutServer, serverBackends } from "../helpers/db.ts";

sayWhySkippedWithoutServer();

const HOMES: Record<string, string> = { acct_a: "one", acct_b: "two" };

async function count(db: Db, sql: string, params: unknown[] = []): Promise<number> {
  const { rows } = await db.query<{ n: number }>(sql, params);
  return rows[0]!.n;
}

describe.each(serverBackends)("sharded store on $name", (backend) => {
  const open: Record<string, OpenDb> = {};
  let store: ShardedStore;
  let app: Hono;

  beforeAll(async () => {
    for (const name of ["one", "two"]) {
      const o = await backend.open();
      open[name] = o;
      await migrate(o.db);
      await o.db.exec(
        "CREATE TABLE payments (id serial PRIMARY KEY, account text NOT NULL, amount_cents int NOT NULL)",
      );
    }
    store = new ShardedStore({
      shards: {
        one: await PostgresStore.open(open.one!.db),
        two: await PostgresStore.open(open.two!.db),
      },
      // Named accounts by a directory, the rest by hash.
      route: (scope) => HOMES[scope] ?? hashRoute(["one", "two"])(scope),
    });
    app = new Hono();
    const scope = (c: Context) => c.req.header("x-account");
    app.post("/v1/payments", idempotency({ store, scope }), async (c) => {
      const { amount_cents } = await c.req.json();
      const { tx, scope: account } = c.var.idempotency;
      const { rows } = await tx.query<{ id: number }>(
        "INSERT INTO payments (account, amount_cents) VALUES ($1, $2) RETURNING id",
        [account, amount_cents],
      );
      if (amount_cents === 13) throw new Error("crash after the effect");
      return c.json({ id: rows[0]!.id, account, amount_cents }, 201);
    });
    app.onError((_err, c) => c.json({ type: "urn:test:crash" }, 500));
  });
  afterAll(async () => {
    for (const o of Object.values(open)) await o.close();
  });

  const post = (account: string, key: string, amount_cents = 500) =>
    app.request("/v1/payments", {
      method: "POST",
      headers: { "x-account": account, "idempotency-key": key, "content-type": "application/json" },
      body: JSON.stringify({ amount_cents }),
    });

  it("puts each account's keys and effects in its own database", async () => {
    for (const account of ["acct_a", "acct_b"]) {
      expect((await post(account, `home-${account}`)).status).toBe(201);
    }
    const one = open.one!.db;
    const two = open.two!.db;
    expect(await count(one, "SELECT count(*)::int AS n FROM payments WHERE account = 'acct_a'")).toBe(1);
    expect(await count(one, "SELECT count(*)::int AS n FROM idem.keys WHERE scope = 'acct_a'")).toBe(1);
    expect(await count(two, "SELECT count(*)::int AS n FROM payments WHERE account = 'acct_b'")).toBe(1);
    expect(await count(two, "SELECT count(*)::int AS n FROM idem.keys WHERE scope = 'acct_b'")).toBe(1);
    expect(await count(one, "SELECT count(*)::int AS n FROM payments WHERE account = 'acct_b'")).toBe(0);
    expect(await count(two, "SELECT count(*)::int AS n FROM idem.keys WHERE scope = 'acct_a'")).toBe(0);
  });

  it("finds every retry's key, for accounts spread over both shards", async () => {
    const accounts = Array.from({ length: 40 }, (_, i) => `acct_spread_${i}`);
    const firsts = await Promise.all(accounts.map(async (a) => (await post(a, "pay-1")).json()));
    const retries = await Promise.all(accounts.map((a) => post(a, "pay-1")));
    for (const [i, r] of retries.entries()) {
      expect(r.headers.get("idempotent-replayed")).toBe("true");
      expect(await r.json()).toEqual(firsts[i]);
    }
    const route = hashRoute(["one", "two"]);
    let perShard = { one: 0, two: 0 };
    for (const a of accounts) {
      const shard = route(a) as "one" | "two";
      perShard = { ...perShard, [shard]: perShard[shard] + 1 };
      const where = [a];
      expect(
        await count(open[shard]!.db, "SELECT count(*)::int AS n FROM payments WHERE account = $1", where),
      ).toBe(1);
      const other = shard === "one" ? "two" : "one";
      expect(
        await count(open[other]!.db, "SELECT count(*)::int AS n FROM payments WHERE account = $1", where),
      ).toBe(0);
    }
    expect(perShard.one).toBeGreaterThan(0);
    expect(perShard.two).toBeGreaterThan(0);
  });

  it("runs concurrent duplicates once, in the account's shard", async () => {
    const replies = await Promise.all(Array.from({ length: 8 }, () => post("acct_b", "dup-storm")));
    const bodies = await Promise.all(replies.map((r) => r.text()));
    expect(new Set(bodies).size).toBe(1);
    expect(replies.filter((r) => r.headers.get("idempotent-replayed") === "true")).toHaveLength(7);
    expect(
      await count(
        open.two!.db,
        "SELECT count(*)::int AS n FROM idem.keys WHERE scope = 'acct_b' AND key = 'dup-storm'",
      ),
    ).toBe(1);
  });

  it("rolls back the shard's effect and key together when the handler crashes", async () => {
    const before = await count(open.one!.db, "SELECT count(*)::int AS n FROM payments");
    expect((await post("acct_a", "crash", 13)).status).toBe(500);
    expect(await count(open.one!.db, "SELECT count(*)::int AS n FROM payments")).toBe(before);
    expect(await count(open.one!.db, "SELECT count(*)::int AS n FROM idem.keys WHERE key = 'crash'")).toBe(0);
    expect((await post("acct_a", "crash", 14)).status).toBe(201);
  });

  it("routes plain transactions by scope, and refuses to guess without one", async () => {
    const db = await store.transaction(
      async (tx) => (await tx.query<{ db: string }>("SELECT current_database() AS db")).rows[0]!.db,
      { scope: "acct_b" },
    );
    expect(db).toBe(new URL(open.two!.url!).pathname.slice(1));
    await expect(store.transaction(async () => 1)).rejects.toThrow(/defaultShard/);
  });

  it("rejects a router answer that names no shard, and shards with different retention", async () => {
    const bad = new ShardedStore({
      shards: store.shards as Record<string, PostgresStore>,
      route: () => "three",
    });
    await expect(() =>
      bad.atomic({ scope: "x", key: "k", fingerprint: new Uint8Array(32) }, async () => {
        throw new Error("must not run");
      }),
    ).toThrow(UnknownShardError);
    const short = await PostgresStore.open(open.one!.db, { retentionMs: 60_000 });
    expect(() => new ShardedStore({ shards: { a: store.shards.two!, b: short }, route: () => "a" })).toThrow(
      /retentionMs/,
    );
  });
});
