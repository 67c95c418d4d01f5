/**
 * The store contract: every driver (PGlite, and pg + postgres.js on the real server) must behave the same.
 */
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { isKeyInFlightError, isKeyMismatchError, type StoredResponse } from "../../src/core/index.ts";
import { INLINE_BODY_MAX, lookupQuery } from "../../src/postgres/atomic/sql.ts";
import type { Db, Tx } from "../../src/postgres/db.ts";
import { fromPg } from "../../src/postgres/drivers/pg.ts";
import { migrate, pendingMigrations } from "../../src/postgres/schema/migrate.ts";
import { MAX_LIVE_PARTITIONS, PartitionWidthError } from "../../src/postgres/schema/partitions.ts";
import { PostgresStore, type PostgresStoreOptions } from "../../src/postgres/store.ts";
import { paymentClaim } from "../helpers/claim.ts";
import { backends, type OpenDb, serverBackends } from "../helpers/db.ts";
import { latch } from "../helpers/latch.ts";
import { TestTime } from "../helpers/time.ts";

const enc = new TextEncoder();
const DAY = 86_400_000;

const claimOf = paymentClaim;

/** The work a request does: one row in `effects`, and a reply naming it. */
async function charge(
  tx: Tx,
  note: string,
  status = 201,
): Promise<{ response: StoredResponse; save: StoredResponse | undefined }> {
  const { rows } = await tx.query<{ id: number }>("INSERT INTO effects (note) VALUES ($1) RETURNING id", [
    note,
  ]);
  const response: StoredResponse = {
    status,
    headers: [["content-type", "application/json"]],
    body: enc.encode(JSON.stringify({ id: rows[0]!.id, note })),
  };
  return { response, save: status < 300 || status === 402 ? response : undefined };
}

/** The keys partitions a lookup of `key` reads (EXPLAIN ANALYZE: pruned when the statement starts). */
async function partitionsRead(db: Db, s: PostgresStore, key: string): Promise<Set<string>> {
  const { text, params } = lookupQuery(s, "acct_1", key);
  const { rows } = await db.query(`EXPLAIN (ANALYZE, FORMAT JSON) ${text}`, params);
  return new Set(JSON.stringify(rows).match(/keys_b\d+/g));
}

async function effects(db: Db): Promise<number> {
  const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM effects");
  return rows[0]!.n;
}

describe.each(backends)("atomic store on $name", (backend) => {
  let open: OpenDb;
  let store: PostgresStore;
  const stores = (options: PostgresStoreOptions = {}) => PostgresStore.open(open.db, options);

  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
    await open.db.exec("CREATE TABLE effects (id serial PRIMARY KEY, note text NOT NULL)");
    store = await stores();
  });
  afterAll(async () => {
    await open?.close();
  });

  it("runs a new key once and replays the saved response byte for byte", async () => {
    const c = claimOf("acct_1", "k-replay", '{"amount_cents":5000}');
    const first = await store.atomic(c, (tx) => charge(tx, "replay"));
    const second = await store.atomic(c, (tx) => charge(tx, "replay-again"));
    expect(first.kind).toBe("executed");
    expect(second.kind).toBe("replayed");
    expect(Buffer.from(second.response.body)).toEqual(Buffer.from(first.response.body));
    expect(second.response.status).toBe(201);
    expect(second.response.headers).toEqual([["content-type", "application/json"]]);
    const { rows } = await open.db.query("SELECT count(*)::int AS n FROM effects WHERE note LIKE 'replay%'");
    expect(rows[0]).toEqual({ n: 1 });
  });

  it("lets replays of one finished key that come together share one read, each with its own answer", async () => {
    // The statements the store sends, counted on its way to the database.
    const lookups: string[] = [];
    const counted: Db = {
      ...open.db,
      query: (sql, params) => {
        // A read of the key without a lock: `lookupAround`, or `lookup` after it (atomic/sql.ts).
        if (/ AS live, body\s/.test(sql)) lookups.push(String(params?.[1]));
        return open.db.query(sql, params);
      },
    };
    const s = await PostgresStore.open(counted);
    const c = claimOf("acct_1", "k-storm", '{"amount_cents":5000}');
    const first = await s.atomic(c, (tx) => charge(tx, "storm"));
    expect(first.kind).toBe("executed");
    // A retry storm: 20 replays at once, and one retry whose body changed among them.
    const mismatch = claimOf("acct_1", "k-storm", '{"amount_cents":9999}');
    const runs = Array.from({ length: 20 }, () => s.atomic(c, (tx) => charge(tx, "storm-again")));
    const changed = s.atomic(mismatch, (tx) => charge(tx, "storm-changed")).catch((e) => e);
    const answers = await Promise.all(runs);
    expect(isKeyMismatchError(await changed)).toBe(true);
    for (const a of answers) {
      expect(a.kind).toBe("replayed");
      expect(Buffer.from(a.response.body)).toEqual(Buffer.from(first.response.body));
      expect(a.response.headers).toEqual([["content-type", "application/json"]]);
    }
    // All 21 came in one turn of the event loop: one read, which the others waited for.
    expect(lookups).toEqual(["k-storm"]);
    // Each answer is its own: what one caller appends (idem adds its headers) or writes over is not
    // seen by another that shared its read.
    answers[0]!.response.headers.push(["x-added", "1"]);
    answers[0]!.response.body.fill(0);
    expect(answers[1]!.response.headers).toEqual([["content-type", "application/json"]]);
    expect(Buffer.from(answers[1]!.response.body)).toEqual(Buffer.from(first.response.body));
    const { rows } = await open.db.query("SELECT count(*)::int AS n FROM effects WHERE note LIKE 'storm%'");
    expect(rows[0]).toEqual({ n: 1 });
  });

  // On PGlite the database runs in this process and reads its clock: the two cannot disagree.
  it.skipIf(backend.name === "pglite")(
    "reads by the database's clock when this process's clock jumps after the store measured it",
    async () => {
      // The reads name the partitions from this process's estimate of the database's time; a clock
      // stepped back three days (an NTP step, a VM resumed) names the wrong ones, and they say so.
      const sent: string[] = [];
      const counted: Db = {
        ...open.db,
        query: (sql, params) => {
          sent.push(sql);
          return open.db.query(sql, params);
        },
      };
      const s = await PostgresStore.open(counted);
      const c = claimOf("acct_1", "k-clock-jump", '{"amount_cents":5000}');
      const first = await s.atomic(c, (tx) => charge(tx, "clock-jump"));
      expect(first.kind).toBe("executed");
      vi.useFakeTimers({ toFake: ["Date"] });
      try {
        vi.setSystemTime(Date.now() - 3 * DAY);
        sent.length = 0;
        // A replay of the key this process saw finished: read without a lock, then by the database's clock.
        const again = await s.atomic(c, (tx) => charge(tx, "clock-jump-again"));
        expect(again.kind).toBe("replayed");
        expect(Buffer.from(again.response.body)).toEqual(Buffer.from(first.response.body));
        expect(sent).toContain(lookupQuery(s, "acct_1", c.key).text);
        // A new key: the locked lookup reads by the database's clock too, and the key is saved once.
        const k = claimOf("acct_1", "k-clock-jump-new", '{"amount_cents":5000}');
        const fresh = await s.atomic(k, (tx) => charge(tx, "clock-jump-new"));
        expect(fresh.kind).toBe("executed");
        const other = await PostgresStore.open(open.db); // another instance, its clock as wrong
        const replay = await other.atomic(k, (tx) => charge(tx, "clock-jump-new-again"));
        expect(replay.kind).toBe("replayed");
        expect(Buffer.from(replay.response.body)).toEqual(
          Buffer.from(fresh.kind === "executed" ? fresh.response.body : []),
        );
      } finally {
        vi.useRealTimers();
      }
      const { rows } = await open.db.query(
        "SELECT count(*)::int AS n FROM effects WHERE note LIKE 'clock-jump%'",
      );
      expect(rows[0]).toEqual({ n: 2 });
    },
  );

  it("replays binary bodies exactly", async () => {
    const bytes = new Uint8Array(256).map((_, i) => i);
    const c = claimOf("acct_1", "k-binary", "{}");
    const response: StoredResponse = {
      status: 200,
      headers: [["content-type", "application/octet-stream"]],
      body: bytes,
    };
    await store.atomic(c, async () => ({ response, save: response }));
    const again = await store.atomic(c, async () => {
      throw new Error("must not run");
    });
    expect(again.kind).toBe("replayed");
    expect(Buffer.from(again.response.body).equals(Buffer.from(bytes))).toBe(true);
  });

  it("replays a large body saved by another instance byte for byte, and tells another request apart", async () => {
    // Larger than the locked lookup returns (INLINE_BODY_MAX): read after the lock, without it.
    const bytes = new Uint8Array(INLINE_BODY_MAX * 3 + 7).map((_, i) => (i * 31) & 0xff);
    const response: StoredResponse = {
      status: 200,
      headers: [["content-type", "application/octet-stream"]],
      body: bytes,
    };
    const report = (note: string) => async (tx: Tx) => {
      await tx.query("INSERT INTO effects (note) VALUES ($1)", [note]);
      return { response, save: response };
    };
    const c = claimOf("acct_1", "k-large", '{"report":1}');
    await store.atomic(c, report("large"));
    // Other instances know nothing of the key: they take the locked path.
    const again = await (await stores()).atomic(c, report("large-again"));
    expect(again.kind).toBe("replayed");
    expect(Buffer.from(again.response.body).equals(Buffer.from(bytes))).toBe(true);
    expect(again.response.headers).toEqual(response.headers);
    // The same with the work's statements sent behind the lookup (rolled back: the key is finished).
    const speculated = await (await stores()).atomic(c, report("large-again"), { speculate: true });
    expect(speculated.kind).toBe("replayed");
    expect(Buffer.from(speculated.response.body).equals(Buffer.from(bytes))).toBe(true);
    const mismatch = await (await stores())
      .atomic(claimOf("acct_1", "k-large", '{"report":2}'), report("large-again"))
      .catch((e) => e);
    expect(isKeyMismatchError(mismatch)).toBe(true);
    const { rows } = await open.db.query<{ note: string; n: number }>(
      "SELECT note, count(*)::int AS n FROM effects WHERE note LIKE 'large%' GROUP BY note",
    );
    expect(rows).toEqual([{ note: "large", n: 1 }]);
  });

  it("answers a different request under the same key with a mismatch and runs nothing", async () => {
    await store.atomic(claimOf("acct_1", "k-mismatch", '{"amount_cents":5000}'), (tx) => charge(tx, "m"));
    const before = await effects(open.db);
    const err = await store
      .atomic(claimOf("acct_1", "k-mismatch", '{"amount_cents":9999}'), (tx) => charge(tx, "m2"))
      .catch((e) => e);
    expect(isKeyMismatchError(err)).toBe(true);
    expect(await effects(open.db)).toBe(before);
  });

  it("treats JSON with reordered keys as the same request", async () => {
    await store.atomic(claimOf("acct_1", "k-order", '{"a":1,"b":{"y":2,"x":1}}'), (tx) => charge(tx, "o"));
    const again = await store.atomic(claimOf("acct_1", "k-order", '{ "b": {"x":1,"y":2}, "a": 1 }'), (tx) =>
      charge(tx, "o"),
    );
    expect(again.kind).toBe("replayed");
  });

  it("saves nothing for an answer that is not final, so the retry executes", async () => {
    const c = claimOf("acct_1", "k-500", "{}");
    const before = await effects(open.db);
    const first = await store.atomic(c, (tx) => charge(tx, "five-hundred", 500));
    expect(first).toMatchObject({ kind: "executed", saved: false });
    expect(await effects(open.db)).toBe(before); // the work rolled back with the claim
    const retry = await store.atomic(c, (tx) => charge(tx, "five-hundred"));
    expect(retry).toMatchObject({ kind: "executed", saved: true });
    expect(await effects(open.db)).toBe(before + 1);
  });

  it("rolls back the claim and the work when the work throws", async () => {
    const c = claimOf("acct_1", "k-crash", "{}");
    const before = await effects(open.db);
    await expect(
      store.atomic(c, async (tx) => {
        await charge(tx, "crash");
        throw new Error("crash after the effect");
      }),
    ).rejects.toThrow("crash after the effect");
    expect(await effects(open.db)).toBe(before);
    expect((await store.atomic(c, (tx) => charge(tx, "crash-retry"))).kind).toBe("executed");
  });

  it("saves nothing when the client hung up before the commit", async () => {
    const c = claimOf("acct_1", "k-gone", "{}");
    const ctl = new AbortController();
    const before = await effects(open.db);
    const first = await store.atomic(
      c,
      async (tx) => {
        const r = await charge(tx, "gone");
        ctl.abort();
        return r;
      },
      { signal: ctl.signal },
    );
    expect(first).toMatchObject({ saved: false });
    expect(await effects(open.db)).toBe(before);
    expect((await store.atomic(c, (tx) => charge(tx, "gone-retry"))).kind).toBe("executed");
  });

  it("keeps scopes apart: two accounts with the same key get two executions", async () => {
    const a = await store.atomic(claimOf("acct_A", "shared-key", "{}"), (tx) => charge(tx, "A"));
    const b = await store.atomic(claimOf("acct_B", "shared-key", "{}"), (tx) => charge(tx, "B"));
    expect(a.kind).toBe("executed");
    expect(b.kind).toBe("executed");
    expect(Buffer.from(a.response.body).toString()).toContain('"A"');
    expect(Buffer.from(b.response.body).toString()).toContain('"B"');
    const replayB = await store.atomic(claimOf("acct_B", "shared-key", "{}"), (tx) => charge(tx, "B"));
    expect(Buffer.from(replayB.response.body).toString()).toContain('"B"');
  });

  it("forgets a key after the retention window, and not before", async () => {
    const now = new TestTime(Date.UTC(2030, 0, 10, 12));
    const s = await stores({ timeShift: now, retentionMs: DAY });
    const c = claimOf("acct_1", "k-expiry", "{}");
    expect((await s.atomic(c, (tx) => charge(tx, "e"))).kind).toBe("executed");
    now.ms += DAY - 60_000;
    expect((await s.atomic(c, (tx) => charge(tx, "e"))).kind).toBe("replayed");
    now.ms += 120_000;
    expect((await s.atomic(c, (tx) => charge(tx, "e"))).kind).toBe("executed");
  });

  it("treats a key as new after expiry when the retention is shorter than a partition", async () => {
    // Retention 60 s in one-day partitions: the expired row is still in the partition the retry writes
    // to. (The database's clock runs on during the test: every step keeps seconds of margin.)
    const boundary = Date.UTC(2034, 3, 5);
    const now = new TestTime(boundary - 30_000);
    const s = await stores({ timeShift: now, retentionMs: 60_000 });
    const c = claimOf("acct_1", "k-short", "{}");
    const bodies: string[] = [];
    const run = async () => {
      const out = await s.atomic(c, (tx) => charge(tx, "short"));
      bodies.push(Buffer.from(out.response.body).toString());
      return out.kind;
    };
    const before = await effects(open.db);
    expect(await run()).toBe("executed"); // bucket b-1
    now.ms += 45_000;
    expect(await run()).toBe("replayed"); // across the boundary, inside the window
    expect(bodies[1]).toBe(bodies[0]);
    now.ms += 20_000; // expired: the retry lands in bucket b
    expect(await run()).toBe("executed");
    now.ms += 61_000; // expired again: its row is in bucket b, where this retry writes too
    expect(await run()).toBe("executed");
    now.ms += 10_000;
    expect(await run()).toBe("replayed");
    expect(bodies[4]).toBe(bodies[3]);
    expect(new Set(bodies).size).toBe(3);
    expect(await effects(open.db)).toBe(before + 3);
    const { rows } = await open.db.query<{ bucket: number; n: number }>(
      "SELECT bucket, count(*)::int AS n FROM idem.keys WHERE key = 'k-short' GROUP BY bucket ORDER BY bucket",
    );
    const b = s.partitions.bucketOf(boundary);
    expect(rows.map((r) => [Number(r.bucket), r.n])).toEqual([
      [b - 1, 1],
      [b, 1],
    ]);
  });

  it("never replaces a live row it did not see: the work rolls back", async () => {
    const now = new TestTime(Date.UTC(2034, 4, 6, 12));
    const s = await stores({ timeShift: now, retentionMs: 60_000 });
    // A live marker row (phases mode's boundary marker), which lookups skip, holds the key's place.
    await open.db.query(
      `INSERT INTO idem.keys (bucket, scope, key, marker, fingerprint, created_at)
       VALUES ($1, 'acct_1', 'k-live-marker', true, '\\x00', $2::timestamptz)`,
      [s.partitions.bucketOf(now.ms), new Date(now.ms - 1_000).toISOString()],
    );
    const before = await effects(open.db);
    const err = await s
      .atomic(claimOf("acct_1", "k-live-marker", "{}"), (tx) => charge(tx, "live-marker"))
      .catch((e) => e);
    expect((err as { code?: string }).code).toBe("23505");
    expect(await effects(open.db)).toBe(before);
  });

  it("drops whole partitions past retention and keeps every key inside the window", async () => {
    const now = new TestTime(Date.UTC(2031, 5, 1, 23, 0));
    const s = await stores({ timeShift: now, retentionMs: DAY });
    const old = claimOf("acct_1", "k-sweep-old", "{}");
    await s.atomic(old, (tx) => charge(tx, "old"));
    now.ms += DAY + 2 * 3_600_000; // next day, 01:00: the old key is 26 h old, its partition's newest could be 25 h
    const fresh = claimOf("acct_1", "k-sweep-new", "{}");
    await s.atomic(fresh, (tx) => charge(tx, "new"));
    const { dropped } = await s.sweep();
    expect(dropped).toContain(s.partitions.bucketOf(Date.UTC(2031, 5, 1, 23, 0)));
    expect(dropped).not.toContain(s.partitions.bucketOf(now.ms));
    expect((await s.atomic(fresh, (tx) => charge(tx, "new"))).kind).toBe("replayed");
    const { rows } = await open.db.query(
      "SELECT count(*)::int AS n FROM idem.keys WHERE key = 'k-sweep-old'",
    );
    expect(rows[0]).toEqual({ n: 0 });
  });

  it("reads no partition made ahead (no key row is ever placed there)", async () => {
    const now = new TestTime(Date.UTC(2035, 7, 1, 12));
    const s = await stores({ timeShift: now }); // makes the partition of now and the one ahead
    const b = s.partitions.bucketOf(now.ms);
    const ahead = await open.db.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_class WHERE relname = 'keys_b${b + 1}'`,
    );
    expect(ahead.rows[0]!.n).toBe(1);
    const read = [...(await partitionsRead(open.db, s, "k-ahead"))].map((n) =>
      Number(n.slice("keys_b".length)),
    );
    expect(read).toContain(b);
    expect(Math.max(...read)).toBe(b);
  });

  it("bounds the partitions a lookup touches, and refuses a retention that would spread over more", async () => {
    // One-minute partitions, 5 minutes of retention: 5 in the window, the current one, one ahead.
    await migrate(open.db, { schema: "narrow", partitionSeconds: 60 });
    const now = new TestTime(Date.UTC(2035, 6, 7, 12, 30, 15));
    const s = await stores({ schema: "narrow", timeShift: now, retentionMs: 5 * 60_000 });
    const b = s.partitions.bucketOf(now.ms);
    // Forty older partitions nobody swept yet, and the key in the oldest one still inside the window.
    await s.partitions.ensure(Array.from({ length: 40 }, (_, i) => b - 40 + i));
    const c = claimOf("acct_1", "k-narrow", "{}");
    now.ms -= 4 * 60_000 + 30_000;
    expect((await s.atomic(c, (tx) => charge(tx, "narrow"))).kind).toBe("executed");
    now.ms += 4 * 60_000 + 30_000;
    expect((await s.atomic(c, (tx) => charge(tx, "narrow"))).kind).toBe("replayed");

    for (const key of ["k-narrow", "k-narrow-missing"]) {
      // The partitions the lookup reads once it starts (pruned by the database's now, at execution).
      const touched = await partitionsRead(open.db, s, key);
      expect(touched.size).toBeGreaterThan(0);
      expect(touched.size).toBeLessThanOrEqual(7);
      expect(touched.size).toBeLessThanOrEqual(MAX_LIVE_PARTITIONS);
    }
    const err = await stores({ schema: "narrow", retentionMs: 3_600_000 }).catch((e) => e);
    expect(err).toBeInstanceOf(PartitionWidthError);
    expect(err.message).toMatch(/partitionSeconds >= 360/);
    // A schema migrated for a 30-day retention gets partitions wide enough for it.
    await migrate(open.db, { schema: "month", retentionMs: 30 * DAY });
    const month = await stores({ schema: "month", retentionMs: 30 * DAY });
    expect(month.partitions.widthMs).toBe(3 * DAY);
  });

  it("tells which migrations are pending", async () => {
    expect(await pendingMigrations(open.db)).toEqual([]);
  });
});

describe.each(serverBackends)("atomic store under concurrency on $name", (backend) => {
  let open: OpenDb;
  let store: PostgresStore;

  beforeAll(async () => {
    open = await backend.open();
    // Several instances migrating at the same moment: one applies, the others find nothing to do.
    const results = await Promise.all([migrate(open.db), migrate(open.db), migrate(open.db)]);
    const counts = results.map((r) => r.applied.length).sort();
    expect(counts.slice(0, 2)).toEqual([0, 0]);
    expect(counts[2]).toBeGreaterThan(0);
    await open.db.exec("CREATE TABLE effects (id serial PRIMARY KEY, note text NOT NULL)");
    store = await PostgresStore.open(open.db);
  });
  afterAll(async () => {
    await open?.close();
  });

  it("sweeps while a long transaction holds the keys table, and requests keep being served meanwhile", async () => {
    const now = new TestTime(Date.UTC(2032, 2, 1, 23, 0));
    const s = await PostgresStore.open(open.db, { timeShift: now, retentionMs: DAY });
    await s.atomic(claimOf("acct_1", "k-held-old", "{}"), (tx) => charge(tx, "held-old"));
    now.ms += DAY + 2 * 3_600_000;
    await s.atomic(claimOf("acct_1", "k-held-new", "{}"), (tx) => charge(tx, "held-new"));

    // A report (or any slow request) reading the keys table, open for the whole test.
    const [held, release] = latch();
    const [opened, reading] = latch();
    const report = open.db.transaction(async (tx) => {
      await tx.query("SELECT count(*) FROM idem.keys");
      reading();
      await held;
    });
    await opened;

    let sweep: Promise<{ dropped: number[] }> | undefined;
    try {
      sweep = s.sweep();
      sweep.catch(() => {}); // awaited below
      // Wait until the sweep waits for the report (to detach the old partition).
      for (let i = 0; ; i++) {
        const { rows } = await open.db.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%idem.keys%'`,
        );
        if (rows[0]!.n > 0) break;
        if (i > 200) throw new Error("the sweep never waited for the open transaction");
        await new Promise((r) => setTimeout(r, 25));
      }
      // New requests and replays go through while the sweep waits (DROP TABLE, or CREATE TABLE ...
      // PARTITION OF, would queue them all behind its lock on the keys table until the report ends).
      const during = await Promise.race([
        Promise.all([
          s.atomic(claimOf("acct_1", "k-held-during", "{}"), (tx) => charge(tx, "held-during")),
          s.atomic(claimOf("acct_1", "k-held-new", "{}"), (tx) => charge(tx, "held-new")),
        ]),
        new Promise<"blocked">((r) => setTimeout(() => r("blocked"), 3_000)),
      ]);
      expect(during === "blocked" ? during : during.map((o) => o.kind)).toEqual(["executed", "replayed"]);
    } finally {
      release();
      await report;
    }
    const { dropped } = await sweep!;
    expect(dropped).toContain(s.partitions.bucketOf(Date.UTC(2032, 2, 1, 23, 0)));
    const { rows } = await open.db.query<{ key: string }>(
      "SELECT key FROM idem.keys WHERE key LIKE 'k-held-%' ORDER BY key",
    );
    expect(rows.map((r) => r.key)).toEqual(["k-held-during", "k-held-new"]);
  });

  it("lets several instances create the same new partitions at the same moment", async () => {
    for (let round = 0; round < 5; round++) {
      const at = Date.UTC(2040 + round, 0, 1); // days no partition exists for yet
      const stores = await Promise.all(
        Array.from({ length: 6 }, () => PostgresStore.open(open.db, { timeShift: new TestTime(at) })),
      );
      const b = stores[0]!.partitions.bucketOf(at);
      expect(await stores[0]!.partitions.list()).toEqual(expect.arrayContaining([b - 1, b, b + 1]));
    }
  });

  it("hands a replay's connection back before its COMMIT is answered, and the next user of it is fine", async () => {
    // One connection, so every request reuses the one a replay just gave back with its COMMIT in flight.
    const one = fromPg(new pg.Pool({ connectionString: open.url, max: 1, pipeline: true } as pg.PoolConfig));
    try {
      const s = await PostgresStore.open(one);
      const c = claimOf("acct_1", "k-one-conn", "{}");
      const first = await s.atomic(c, (tx) => charge(tx, "one-conn"));
      const outs = [];
      for (let i = 0; i < 30; i++) {
        outs.push(await s.atomic(c, (tx) => charge(tx, "one-conn"))); // a replay...
        outs.push(await s.atomic(claimOf("acct_1", `k-one-conn-${i}`, "{}"), (tx) => charge(tx, `n${i}`))); // ...then new work
      }
      expect(outs.map((o) => o.kind)).toEqual(
        Array.from({ length: 30 }, () => ["replayed", "executed"]).flat(),
      );
      expect(Buffer.from(outs[0]!.response.body).toString()).toBe(
        Buffer.from(first.response.body).toString(),
      );
      // Concurrent replays on the one connection: every one answered, no lock left behind.
      const many = await Promise.all(
        Array.from({ length: 20 }, () => s.atomic(c, (tx) => charge(tx, "one-conn"))),
      );
      expect(many.every((o) => o.kind === "replayed")).toBe(true);
      const { rows } = await one.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM pg_locks
          WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
      );
      expect(rows[0]).toEqual({ n: 0 });
      expect(
        (await one.query<{ n: number }>("SELECT count(*)::int AS n FROM effects WHERE note = 'one-conn'"))
          .rows[0],
      ).toEqual({ n: 1 });
    } finally {
      await one.close();
    }
  });

  it("runs 20 concurrent duplicates once and gives all of them the same body", async () => {
    const c = claimOf("acct_1", "k-storm", "{}");
    const outs = await Promise.all(
      Array.from({ length: 20 }, () =>
        store.atomic(c, async (tx) => {
          const r = await charge(tx, "storm");
          await new Promise((res) => setTimeout(res, 50));
          return r;
        }),
      ),
    );
    expect(outs.filter((o) => o.kind === "executed")).toHaveLength(1);
    const bodies = new Set(outs.map((o) => Buffer.from(o.response.body).toString()));
    expect(bodies.size).toBe(1);
    const { rows } = await open.db.query("SELECT count(*)::int AS n FROM effects WHERE note = 'storm'");
    expect(rows[0]).toEqual({ n: 1 });
  });

  it("lets the waiting duplicate execute when the first one rolls back", async () => {
    const c = claimOf("acct_1", "k-rollback", "{}");
    const [gate, release] = latch();
    const first = store
      .atomic(c, async (tx) => {
        await charge(tx, "rb-first");
        await gate;
        throw new Error("first crashed");
      })
      .catch((e: Error) => e.message);
    await new Promise((r) => setTimeout(r, 100));
    const second = store.atomic(c, (tx) => charge(tx, "rb-second"));
    await new Promise((r) => setTimeout(r, 100));
    release();
    expect(await first).toBe("first crashed");
    expect((await second).kind).toBe("executed");
    const { rows } = await open.db.query("SELECT note FROM effects WHERE note LIKE 'rb-%'");
    expect(rows).toEqual([{ note: "rb-second" }]);
  });

  it("answers 409 in flight when the first request holds the key past the lock timeout", async () => {
    const s = await PostgresStore.open(open.db, { lockTimeoutMs: 200 });
    const c = claimOf("acct_1", "k-inflight", "{}");
    const [gate, release] = latch();
    const first = s.atomic(c, async (tx) => {
      const r = await charge(tx, "inflight");
      await gate;
      return r;
    });
    await new Promise((r) => setTimeout(r, 100));
    const err = await s.atomic(c, (tx) => charge(tx, "inflight")).catch((e) => e);
    expect(isKeyInFlightError(err)).toBe(true);
    expect(err.retryAfterSeconds).toBeGreaterThan(0);
    release();
    expect((await first).kind).toBe("executed");
    expect((await s.atomic(c, (tx) => charge(tx, "inflight"))).kind).toBe("replayed");
  });

  it("answers 409 after lockTimeoutMs to a duplicate from another process, then replays", async () => {
    // Two stores stand for two processes: the second cannot wait in memory, it polls the key's lock.
    const [a, b] = await Promise.all([0, 1].map(() => PostgresStore.open(open.db, { lockTimeoutMs: 300 })));
    const c = claimOf("acct_1", "k-inflight-two", "{}");
    const [gate, release] = latch();
    const [holding, running] = latch();
    const first = a!.atomic(c, async (tx) => {
      const r = await charge(tx, "inflight-two");
      running(); // the work runs: the key's lock is held
      await gate;
      return r;
    });
    await holding;
    const t = performance.now();
    const err = await b!.atomic(c, (tx) => charge(tx, "inflight-two")).catch((e) => e);
    const waited = performance.now() - t;
    expect(isKeyInFlightError(err)).toBe(true);
    expect(err.retryAfterSeconds).toBeGreaterThan(0);
    expect(waited).toBeGreaterThanOrEqual(250);
    release();
    expect((await first).kind).toBe("executed");
    expect((await b!.atomic(c, (tx) => charge(tx, "inflight-two"))).kind).toBe("replayed");
  });

  /*
   * The partition boundary: A claims 1 ms before a new partition starts and is still running when its
   * duplicate B arrives 1 ms after. Their key rows belong to different partitions, whose unique indexes
   * know nothing of each other; the per-key lock is what makes B wait for A and then replay.
   */
  it("never runs a retry twice when two duplicates race across a partition boundary", async () => {
    // (Half a minute each side: the database's clock runs on while the test runs.)
    const boundary = Date.UTC(2033, 2, 3);
    const a = await PostgresStore.open(open.db, { timeShift: new TestTime(boundary - 30_000) });
    const b = await PostgresStore.open(open.db, { timeShift: new TestTime(boundary + 30_000) });
    expect(a.partitions.bucketOf(boundary - 30_000)).toBe(b.partitions.bucketOf(boundary + 30_000) - 1);
    const c = claimOf("acct_1", "k-boundary", "{}");
    const [gate, release] = latch();
    const [holding, running] = latch();
    const first = a.atomic(c, async (tx) => {
      const r = await charge(tx, "boundary");
      running(); // the work runs: the key's lock is held
      await gate;
      return r;
    });
    await holding;
    const second = b.atomic(c, (tx) => charge(tx, "boundary"));
    await new Promise((r) => setTimeout(r, 100));
    release();
    const outs = await Promise.all([first, second]);
    expect(outs.map((o) => o.kind)).toEqual(["executed", "replayed"]);
    expect(Buffer.from(outs[1].response.body)).toEqual(Buffer.from(outs[0].response.body));
    const { rows } = await open.db.query("SELECT count(*)::int AS n FROM effects WHERE note = 'boundary'");
    expect(rows[0]).toEqual({ n: 1 });
  });

  it("shows why the lock is needed: the unique index alone lets one key into two partitions", async () => {
    const boundary = Date.UTC(2033, 2, 3);
    const s = await PostgresStore.open(open.db, { timeShift: new TestTime(boundary) });
    const bucket = s.partitions.bucketOf(boundary);
    for (const bkt of [bucket - 1, bucket]) {
      await open.db.query(
        `INSERT INTO idem.keys (bucket, scope, key, fingerprint, created_at) VALUES ($1, 'acct_1', 'k-two-rows', '\\x00', now())`,
        [bkt],
      );
    }
    const { rows } = await open.db.query("SELECT count(*)::int AS n FROM idem.keys WHERE key = 'k-two-rows'");
    expect(rows[0]).toEqual({ n: 2 });
  });
});
