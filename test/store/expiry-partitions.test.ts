/**
 * The store's promises about time (issue 21): the expiry it reports is `created_at + retention` (the
 * same on the first answer and on every replay), a key is forgotten at that moment by the database's
 * clock, a store whose database time has moved past the partitions it made at open still saves and
 * replays keys, and what is not saved leaves nothing behind. PGlite always; pg and postgres.js on the
 * real server when DATABASE_URL is set.
 */
import { Hono } from "hono";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import {
  type Claim,
  fingerprint,
  isKeyMismatchError,
  RetryableError,
  type StoredResponse,
} from "../../src/core/index.ts";
import { idempotency } from "../../src/http/hono.ts";
import type { Db, Tx } from "../../src/postgres/db.ts";
import { fromPg } from "../../src/postgres/drivers/pg.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PartitionWidthError } from "../../src/postgres/schema/partitions.ts";
import { PostgresStore, type PostgresStoreOptions } from "../../src/postgres/store.ts";
import { backends, type OpenDb } from "../helpers/db.ts";
import { TestTime } from "../helpers/time.ts";

const enc = new TextEncoder();
const HOUR = 3_600_000;
const DAY = 24 * HOUR;

const claimOf = (key: string, body = "{}"): Claim => ({
  scope: "acct_1",
  key,
  fingerprint: fingerprint({
    method: "POST",
    path: "/v1/payments",
    contentType: "application/json",
    body: enc.encode(body),
  }),
});

const reply = (id: number, status = 201): StoredResponse => ({
  status,
  headers: [["content-type", "application/json"]],
  body: enc.encode(JSON.stringify({ id })),
});

async function charge(tx: Tx, status = 201) {
  const { rows } = await tx.query<{ id: number }>("INSERT INTO effects DEFAULT VALUES RETURNING id");
  const response = reply(rows[0]!.id, status);
  return { response, save: status < 300 ? response : undefined };
}

async function effects(db: Db): Promise<number> {
  const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM effects");
  return rows[0]!.n;
}

/** `npm run mutate` runs this file once per mutant: there, the real server through `pg` only. */
const only = process.env.IDEM_MUTATION_BACKEND;
const chosen = only ? backends.filter((b) => b.name === only) : backends;
if (only && chosen.length === 0) throw new Error(`IDEM_MUTATION_BACKEND=${only}: set DATABASE_URL`);

/** A Hono payments route on `s` whose handler inserts one effect; `post()` sends `key`, `runs()` counts. */
function paymentsApp(s: PostgresStore, key: string) {
  let runs = 0;
  const app = new Hono();
  app.post("/v1/payments", idempotency({ store: s, scope: () => "acct_1" }), async (ctx) => {
    runs++;
    const { rows } = await ctx.var.idempotency.tx.query<{ id: number }>(
      "INSERT INTO effects DEFAULT VALUES RETURNING id",
    );
    return ctx.json({ id: rows[0]!.id }, 201);
  });
  return {
    post: () =>
      app.request("/v1/payments", {
        method: "POST",
        headers: { "idempotency-key": key, "content-type": "application/json" },
        body: "{}",
      }),
    runs: () => runs,
  };
}

describe.each(chosen)("the store's time on $name", (backend) => {
  let open: OpenDb;
  // Hourly partitions hold at most 10 hours of retention (PartitionWidthError beyond): 6 h unless said.
  const stores = (options: PostgresStoreOptions) =>
    PostgresStore.open(open.db, { retentionMs: 6 * HOUR, ...options });

  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db, { partitionSeconds: 3_600 });
    await open.db.exec("CREATE TABLE effects (id serial PRIMARY KEY)");
  });
  afterAll(async () => {
    await open?.close();
  });

  it("reports expiry as created_at + retention, on the first answer and on every replay", async () => {
    const now = new TestTime(Date.UTC(2031, 2, 3, 10, 15, 30, 250));
    const s = await stores({ timeShift: now, retentionMs: 2 * HOUR });
    const c = claimOf("k-expires");
    const first = await s.atomic(c, (tx) => charge(tx));
    expect(first).toMatchObject({ kind: "executed", saved: true });
    const { rows } = await open.db.query<{ created_at: Date }>(
      "SELECT created_at FROM idem.keys WHERE key = 'k-expires'",
    );
    const created = new Date(rows[0]!.created_at).getTime(); // the database's now, at the claim
    expect(first.expiresAt.getTime()).toBe(created + 2 * HOUR);
    now.ms += HOUR;
    const replay = await s.atomic(c, (tx) => charge(tx));
    expect(replay.kind).toBe("replayed");
    expect(replay.expiresAt.getTime()).toBe(created + 2 * HOUR);
    expect(Buffer.from(replay.response.body).toString()).toBe(Buffer.from(first.response.body).toString());
  });

  it("forgets a key at created_at + retention by the database's clock: just before is a replay", async () => {
    const now = new TestTime(Date.UTC(2031, 2, 4, 8));
    const s = await stores({ timeShift: now, retentionMs: HOUR });
    const c = claimOf("k-boundary");
    await s.atomic(c, (tx) => charge(tx));
    const { rows } = await open.db.query<{ created_at: Date }>(
      "SELECT created_at FROM idem.keys WHERE key = 'k-boundary'",
    );
    const created = new Date(rows[0]!.created_at).getTime();
    now.ms = created + HOUR - 10_000; // the database's clock runs on: ten seconds of margin
    expect((await s.atomic(c, (tx) => charge(tx))).kind).toBe("replayed");
    // created_at has microseconds that getTime() drops: one more millisecond is past it, however fast
    // the next statement runs.
    now.ms = created + HOUR + 1;
    expect((await s.atomic(c, (tx) => charge(tx))).kind).toBe("executed");
  });

  it("a key expired in the partition it is saved again in: its row is replaced, the new reply replays", async () => {
    // Retention (10 min) shorter than a partition (1 h): the expired row is still in the bucket.
    const now = new TestTime(Date.UTC(2031, 2, 4, 14, 5));
    const s = await stores({ timeShift: now, retentionMs: 600_000 });
    const c = claimOf("k-replaced");
    const first = await s.atomic(c, (tx) => charge(tx));
    now.ms += 20 * 60_000; // 14:25, the same hourly partition, the first row expired
    const again = await s.atomic(c, (tx) => charge(tx));
    expect(again).toMatchObject({ kind: "executed", saved: true });
    expect(Buffer.from(again.response.body).toString()).not.toBe(Buffer.from(first.response.body).toString());
    const { rows } = await open.db.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM idem.keys WHERE key = 'k-replaced'",
    );
    expect(rows[0]!.n).toBe(1);
    const replay = await s.atomic(c, (tx) => charge(tx));
    expect(replay.kind).toBe("replayed");
    expect(Buffer.from(replay.response.body).toString()).toBe(Buffer.from(again.response.body).toString());
  });

  // PGlite reads its clock from this process's Date.now: only a server can be days apart.
  it.skipIf(backend.name === "pglite")(
    "a process clock days behind the database's still finds a saved key, and saves a new one once",
    async () => {
      // The locked lookup names its partitions from this process's estimate of the database's time; the
      // database says when they miss one, and the lookup reads again by its own clock.
      const s = await stores({});
      const c = claimOf("k-skewed");
      const first = await s.atomic(c, (tx) => charge(tx));
      const behind = await stores({}); // has not seen the key: it takes the locked path
      const before = await effects(open.db);
      const realNow = Date.now.bind(Date);
      const clock = vi.spyOn(Date, "now").mockImplementation(() => realNow() - 3 * DAY);
      try {
        const replay = await behind.atomic(c, (tx) => charge(tx));
        expect(replay.kind).toBe("replayed");
        expect(Buffer.from(replay.response.body).toString()).toBe(
          Buffer.from(first.response.body).toString(),
        );
        const fresh = claimOf("k-skewed-new");
        expect((await behind.atomic(fresh, (tx) => charge(tx))).kind).toBe("executed");
        expect((await behind.atomic(fresh, (tx) => charge(tx))).kind).toBe("replayed");
      } finally {
        clock.mockRestore();
      }
      expect(await effects(open.db)).toBe(before + 1);
    },
  );

  it("a key saved in an earlier partition is still found (and replayed) within retention", async () => {
    const now = new TestTime(Date.UTC(2031, 2, 5, 8, 59, 50));
    const s = await stores({ timeShift: now, retentionMs: 3 * HOUR });
    const c = claimOf("k-across");
    await s.atomic(c, (tx) => charge(tx));
    now.ms += 2 * HOUR; // two partitions later
    const again = await s.atomic(c, (tx) => charge(tx));
    expect(again.kind).toBe("replayed");
  });

  it("a store whose database time moved past its partitions creates the partition and saves the key", async () => {
    const now = new TestTime(Date.UTC(2031, 3, 1, 12));
    const s = await stores({ timeShift: now, retentionMs: 6 * HOUR });
    now.ms += 30 * DAY; // far past the partitions made at open
    const before = await effects(open.db);
    const c = claimOf("k-no-partition");
    const first = await s.atomic(c, (tx) => charge(tx));
    expect(first).toMatchObject({ kind: "executed", saved: true });
    expect(Math.abs(first.expiresAt.getTime() - (now.ms + 6 * HOUR))).toBeLessThan(5_000);
    expect(await effects(open.db)).toBe(before + 1);
    expect((await s.atomic(c, (tx) => charge(tx))).kind).toBe("replayed");
    expect(await effects(open.db)).toBe(before + 1);
  });

  it("through an HTTP adapter, the first request past the store's partitions is answered once, 201", async () => {
    const now = new TestTime(Date.UTC(2031, 3, 3, 12));
    const s = await stores({ timeShift: now });
    now.ms += 30 * DAY;
    const app = paymentsApp(s, "k-http-no-partition");
    const post = app.post;
    const first = await post();
    expect(first.status).toBe(201);
    const again = await post();
    expect(again.status).toBe(201);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(await again.json()).toEqual(await first.json());
    expect(app.runs()).toBe(1);
  });

  it("a partition dropped under a running store (a sweep with a shorter retention): 503, made again, the retry saves", async () => {
    await migrate(open.db, { schema: "dropped", partitionSeconds: 3_600 });
    const now = Date.UTC(2031, 3, 5, 12, 30);
    const s = await stores({ schema: "dropped", timeShift: new TestTime(now) });
    // Another instance, configured for one hour, sweeps three hours later: it drops the partitions s
    // made at open, the current one included (s's time is held back: it has not seen those hours).
    const sweeper = await stores({
      schema: "dropped",
      timeShift: new TestTime(now + 3 * HOUR),
      retentionMs: HOUR,
    });
    expect((await sweeper.sweep()).dropped).toContain(s.partitions.bucketOf(now));
    const before = await effects(open.db);
    const c = claimOf("k-dropped");
    let runs = 0;
    const counted = (tx: Tx) => {
      runs++;
      return charge(tx);
    };
    // The work ran once and rolled back with the key row that had nowhere to go: the caller retries.
    const err = await s.atomic(c, counted).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RetryableError);
    expect((err as RetryableError).status).toBe(503);
    expect(runs).toBe(1);
    expect(await effects(open.db)).toBe(before);
    expect(await s.atomic(c, counted)).toMatchObject({ kind: "executed", saved: true });
    expect(runs).toBe(2);
    expect(await effects(open.db)).toBe(before + 1);
    expect((await s.atomic(c, (tx) => charge(tx))).kind).toBe("replayed");
    expect(await s.partitions.list()).toContain(s.partitions.bucketOf(now));
  });

  it("through an HTTP adapter, a dropped partition is a 503 the client may retry, and the handler runs once per request", async () => {
    await migrate(open.db, { schema: "dropped_http", partitionSeconds: 3_600 });
    const now = Date.UTC(2031, 3, 6, 12, 30);
    const s = await stores({ schema: "dropped_http", timeShift: new TestTime(now) });
    const sweeper = await stores({
      schema: "dropped_http",
      timeShift: new TestTime(now + 3 * HOUR),
      retentionMs: HOUR,
    });
    expect((await sweeper.sweep()).dropped).toContain(s.partitions.bucketOf(now));
    const app = paymentsApp(s, "k-http-dropped");
    const post = app.post;
    const before = await effects(open.db);
    const first = await post();
    expect(first.status).toBe(503);
    expect(first.headers.get("retry-after")).toBe("1");
    expect(first.headers.get("content-type")).toContain("application/problem+json");
    expect(app.runs()).toBe(1);
    expect(await effects(open.db)).toBe(before);
    const retry = await post();
    expect(retry.status).toBe(201);
    expect(app.runs()).toBe(2);
    const again = await post();
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(await again.json()).toEqual(await retry.json());
    expect(app.runs()).toBe(2);
    expect(await effects(open.db)).toBe(before + 1);
  });

  it("an answer that is not saved leaves no key and no writes; its expiry is now", async () => {
    const now = new TestTime(Date.UTC(2031, 2, 6, 9));
    const s = await stores({ timeShift: now });
    const before = await effects(open.db);
    const c = claimOf("k-503");
    const out = await s.atomic(c, (tx) => charge(tx, 503));
    expect(out).toMatchObject({ kind: "executed", saved: false });
    expect(out.response.status).toBe(503);
    expect(Math.abs(out.expiresAt.getTime() - now.ms)).toBeLessThan(5_000);
    expect(await effects(open.db)).toBe(before);
    expect((await s.atomic(c, (tx) => charge(tx))).kind).toBe("executed");
  });

  it("the work's own error comes out unchanged, and nothing is kept", async () => {
    const s = await stores({ timeShift: new TestTime(Date.UTC(2031, 2, 6, 10)) });
    const before = await effects(open.db);
    const boom = Object.assign(new Error("card network down"), { code: "55P03" });
    const c = claimOf("k-throws");
    const err = await s
      .atomic(c, async (tx) => {
        await charge(tx);
        throw boom;
      })
      .catch((e: unknown) => e);
    expect(err).toBe(boom);
    expect(await effects(open.db)).toBe(before);
    expect((await s.atomic(c, (tx) => charge(tx))).kind).toBe("executed");
  });

  it("another request under a saved key is refused, and so is it after a replay", async () => {
    const s = await stores({ timeShift: new TestTime(Date.UTC(2031, 2, 6, 11)) });
    await s.atomic(claimOf("k-mismatch", '{"a":1}'), (tx) => charge(tx));
    const err = await s.atomic(claimOf("k-mismatch", '{"a":2}'), (tx) => charge(tx)).catch((e: unknown) => e);
    expect(isKeyMismatchError(err)).toBe(true);
  });

  it("a store opened before migrate says how to fix it, with the database's error as the cause", async () => {
    const err = await PostgresStore.open(open.db, { schema: "not_migrated" }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).message).toBe(
      'idem\'s tables are missing in schema "not_migrated": run migrate(db) or `idem migrate` first',
    );
    expect((err as Error).cause).toMatchObject({ code: "42P01" });
  });

  it("a database it cannot reach is reported as such when a store opens, not as a missing migration", async () => {
    const nowhere = fromPg(new pg.Pool({ connectionString: "postgres://postgres@127.0.0.1:1/none" }));
    try {
      const err = await PostgresStore.open(nowhere).catch((e: unknown) => e);
      expect(err).toMatchObject({ code: "ECONNREFUSED" });
      expect((err as Error).message).not.toMatch(/migrate/);
    } finally {
      await nowhere.close();
    }
  });

  it("sweep drops the partitions whose keys are all past retention; live keys still replay byte for byte", async () => {
    await migrate(open.db, { schema: "swept", partitionSeconds: 3_600 });
    const now = new TestTime(Date.UTC(2031, 5, 1, 10, 30));
    const s = await stores({ schema: "swept", timeShift: now, retentionMs: 2 * HOUR });
    const old = claimOf("k-swept");
    await s.atomic(old, (tx) => charge(tx));
    const oldBucket = s.partitions.bucketOf(now.ms);
    now.ms += 3 * HOUR;
    const live = claimOf("k-live");
    const first = await s.atomic(live, (tx) => charge(tx));
    const { dropped } = await s.sweep();
    expect(dropped).toContain(oldBucket);
    expect(dropped).not.toContain(s.partitions.bucketOf(now.ms - 2 * HOUR));
    expect(dropped).not.toContain(s.partitions.bucketOf(now.ms));
    const again = await s.atomic(live, (tx) => charge(tx));
    expect(again.kind).toBe("replayed");
    expect(Buffer.from(again.response.body).toString()).toBe(Buffer.from(first.response.body).toString());
    expect((await s.atomic(old, (tx) => charge(tx))).kind).toBe("executed");
    expect((await s.sweep()).dropped).toEqual([]);
  });

  it("refuses a retention that is not positive, or longer than its partitions can hold", async () => {
    await expect(stores({ retentionMs: 0 })).rejects.toThrow(
      new RangeError("retentionMs must be a positive number of ms, got 0"),
    );
    await expect(stores({ retentionMs: -HOUR })).rejects.toThrow(RangeError);
    await expect(stores({ retentionMs: 11 * HOUR })).rejects.toThrow(PartitionWidthError);
    expect((await stores({ retentionMs: 10 * HOUR })).retentionMs).toBe(10 * HOUR);
  });

  it("a lock timeout below 1 ms is sent as 1 ms, and the defaults are 24 h and 5 s", async () => {
    const s = await stores({ lockTimeoutMs: 0.4 });
    const lock = s.lockSql("a", "k");
    const sql = typeof lock === "string" ? lock : lock.sql;
    expect(sql).toMatch(/lock_timeout[^;]*'1ms'/);
    expect(sql).toMatch(/pg_advisory_xact_lock\((-?\d+|\$1::bigint)\)/);
    await migrate(open.db, { schema: "defaults" }); // default daily partitions for the default retention
    const d = await PostgresStore.open(open.db, { schema: "defaults" });
    expect(d.retentionMs).toBe(DAY);
    expect(d.lockTimeoutMs).toBe(5_000);
    expect(d.lockSql("a", "k")).not.toEqual(d.lockSql("a", "k2"));
  });
});
