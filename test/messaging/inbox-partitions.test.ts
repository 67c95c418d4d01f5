/**
 * The inbox partitioned by time (issue 16): dedup marks expire a partition at a time, and a message
 * inside the retention window is never applied twice, including across a partition boundary, one copy
 * after the other or both at once, message by message or in batches.
 */

import { readFile } from "node:fs/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Inbox, sweepInbox } from "../../src/messaging/inbox.ts";
import type { Delivery } from "../../src/messaging/types.ts";
import type { Db, Tx } from "../../src/postgres/db.ts";
import { MIGRATIONS_DIR, migrate } from "../../src/postgres/schema/migrate.ts";
import { Partitions } from "../../src/postgres/schema/partitions.ts";
import { backends, type OpenDb, serverBackends } from "../helpers/db.ts";
import { unique } from "./helpers.ts";

const HOUR = 3_600_000;

function delivery(id: string): Delivery {
  return { id, topic: "t", type: "x", body: "{}", headers: {}, redelivered: false };
}

async function prepare(db: Db): Promise<void> {
  await migrate(db, { partitionSeconds: 3_600 }); // one partition per hour
  await db.exec("CREATE TABLE applied (consumer text NOT NULL, message_id text NOT NULL)");
}

async function appliedCount(db: Db, consumer: string, id: string): Promise<number> {
  const { rows } = await db.query<{ n: string }>(
    "SELECT count(*) AS n FROM applied WHERE consumer = $1 AND message_id = $2",
    [consumer, id],
  );
  return Number(rows[0]!.n);
}

/** The start of an hour partition well ahead of now (the migration's first partition holds the past). */
const boundary = (Math.floor(Date.now() / HOUR) + 5) * HOUR;

describe.each(backends)("inbox partitions on $name", (backend) => {
  let open: OpenDb;
  let db: Db;
  beforeAll(async () => {
    open = await backend.open();
    db = open.db;
    await prepare(db);
  });
  afterAll(() => open?.close());

  const effect = (consumer: string) => async (tx: Tx, m: Delivery) => {
    await tx.query("INSERT INTO applied (consumer, message_id) VALUES ($1, $2)", [consumer, m.id]);
  };

  it("finds a copy in an older partition: one second before the boundary, then 30 minutes and 5 hours after", async () => {
    const consumer = unique("c");
    let now = boundary - 1_000;
    const inbox = new Inbox(db, { consumer, clock: () => now });
    expect(await inbox.process(delivery("m1"), effect(consumer))).toBe("applied");
    now = boundary + 30 * 60_000; // past the 10-minute overlap: the mark is in the previous partition only
    expect(await inbox.process(delivery("m1"), effect(consumer))).toBe("duplicate");
    now = boundary + 5 * HOUR; // a partition that did not exist yet: created on the way
    expect(await inbox.process(delivery("m1"), effect(consumer))).toBe("duplicate");
    expect(await inbox.processBatch([delivery("m1"), delivery("m2")], effect(consumer))).toEqual([
      "duplicate",
      "applied",
    ]);
    expect(await appliedCount(db, consumer, "m1")).toBe(1);
  });

  it("starts where the clock is hours behind the migration's: its first partition holds those buckets", async () => {
    // The migration made one partition for every hour before its own (sql/0005). An instance whose
    // clock is 3 hours behind makes the partitions around its own hour at start (as `migrate` and
    // `idem sweep` do): each of its own there would overlap that one, and start-up failed (42P17).
    const behind = Date.now() - 3 * HOUR;
    await new Partitions(db, "idem", HOUR, "inbox").makeAhead(behind);
    const consumer = unique("c");
    const inbox = new Inbox(db, { consumer, clock: () => behind });
    expect(await inbox.process(delivery("late"), effect(consumer))).toBe("applied");
    expect(await inbox.process(delivery("late"), effect(consumer))).toBe("duplicate");
    expect(await appliedCount(db, consumer, "late")).toBe(1);
  });

  it("marks early in a partition also in the previous one (a batch too), and counts it once", async () => {
    const consumer = unique("c");
    const inbox = new Inbox(db, { consumer, clock: () => boundary + 60_000 });
    expect(await inbox.processBatch([delivery("a"), delivery("b")], effect(consumer))).toEqual([
      "applied",
      "applied",
    ]);
    expect(await inbox.process(delivery("c"), effect(consumer))).toBe("applied");
    const { rows } = await db.query<{ message_id: string; status: string; bucket: number }>(
      "SELECT message_id, status, bucket FROM idem.inbox WHERE consumer = $1 ORDER BY message_id, bucket",
      [consumer],
    );
    const b = boundary / HOUR;
    expect(rows.map((r) => [r.message_id, r.status, Number(r.bucket)])).toEqual([
      ["a", "marker", b - 1],
      ["a", "done", b],
      ["b", "marker", b - 1],
      ["b", "done", b],
      ["c", "marker", b - 1],
      ["c", "done", b],
    ]);
    expect(await inbox.processBatch([delivery("a"), delivery("c")], effect(consumer))).toEqual([
      "duplicate",
      "duplicate",
    ]);
  });

  it("drops whole partitions past retention with sweepInbox; marks inside the window still deduplicate", async () => {
    const consumer = unique("c");
    let now = boundary + 20 * 60_000;
    const inbox = new Inbox(db, { consumer, clock: () => now });
    expect(await inbox.process(delivery("kept"), effect(consumer))).toBe("applied");
    // Two hours' retention: at boundary + 2h 50m the mark (made at boundary + 20m) is still inside.
    now = boundary + 2 * HOUR + 50 * 60_000;
    const first = await sweepInbox(db, { retentionMs: 2 * HOUR, clock: () => now });
    expect(first.dropped).not.toContain(boundary / HOUR);
    expect(first.dropped.length).toBeGreaterThan(0); // the partitions before it (the migration's first)
    expect(await inbox.process(delivery("kept"), effect(consumer))).toBe("duplicate");
    // At boundary + 3h every mark of that partition is past the window: it goes, as a whole.
    now = boundary + 3 * HOUR;
    const second = await sweepInbox(db, { retentionMs: 2 * HOUR, clock: () => now });
    expect(second.dropped).toEqual([boundary / HOUR]);
    const { rows } = await db.query<{ n: string }>(
      "SELECT count(*) AS n FROM idem.inbox WHERE consumer = $1",
      [consumer],
    );
    expect(Number(rows[0]!.n)).toBe(0);
    expect(await appliedCount(db, consumer, "kept")).toBe(1);
  });
});

describe.each(backends)("an inbox from before partitioning, on $name", (backend) => {
  it("keeps its marks through the migration: their copies are still duplicates, until the sweep drops them", async () => {
    const { db, close } = await backend.open();
    try {
      // The schema as 0004 left it, with marks in the unpartitioned inbox.
      await db.exec(
        "CREATE SCHEMA idem; CREATE TABLE idem.migrations (id integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
      );
      for (const name of ["0001_keys.sql", "0002_phases.sql", "0003_messaging.sql", "0004_compact.sql"]) {
        const sql = await readFile(new URL(name, MIGRATIONS_DIR), "utf8");
        await db.exec(sql.replaceAll("{{schema}}", "idem").replaceAll("{{partition_seconds}}", "3600"));
        await db.query("INSERT INTO idem.migrations (id, name) VALUES ($1, $2)", [
          Number.parseInt(name, 10),
          name,
        ]);
      }
      await db.exec(`INSERT INTO idem.inbox (consumer, message_id) VALUES ('c', 'old-1'), ('c', 'old-2')`);
      // 0005 and any later migration (this test is about 0005 turning the old inbox into partitions).
      expect((await migrate(db)).applied[0]).toBe("0005_inbox_partitions.sql");
      await db.exec("CREATE TABLE applied (consumer text NOT NULL, message_id text NOT NULL)");
      let now = Date.now();
      const inbox = new Inbox(db, { consumer: "c", clock: () => now });
      const record = async (tx: Tx, m: Delivery) => {
        await tx.query("INSERT INTO applied (consumer, message_id) VALUES ('c', $1)", [m.id]);
      };
      expect(await inbox.processBatch([delivery("old-1"), delivery("new-1")], record)).toEqual([
        "duplicate",
        "applied",
      ]);
      expect(await inbox.process(delivery("old-2"), record)).toBe("duplicate");
      // The old marks form the first partition (every bucket before the migration's); it is dropped
      // as a whole once a retention has passed.
      const legacy = async () => {
        const { rows } = await db.query<{ n: string }>(
          `SELECT count(*) AS n FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'idem' AND c.relname LIKE 'inbox_b%' AND c.relispartition
             AND pg_get_expr(c.relpartbound, c.oid) LIKE '%MINVALUE%'`,
        );
        return Number(rows[0]!.n);
      };
      expect(await legacy()).toBe(1);
      now += 3 * HOUR;
      await sweepInbox(db, { retentionMs: HOUR, clock: () => now });
      expect(await legacy()).toBe(0);
    } finally {
      await close();
    }
  });
});

describe.each(serverBackends)("inbox partitions under concurrency on $name", (backend) => {
  let open: OpenDb;
  let db: Db;
  beforeAll(async () => {
    open = await backend.open();
    db = open.db;
    await prepare(db);
  });
  afterAll(() => open?.close());

  for (const batch of [false, true]) {
    it(`applies a message once when two copies are processed at once on either side of a boundary${batch ? " (batches)" : ""}`, async () => {
      const consumer = unique("c");
      const id = unique("m");
      // Copy A, one second before the boundary, holds its transaction open until B has started.
      const before = new Inbox(db, { consumer, clock: () => boundary - 1_000 });
      const after = new Inbox(db, { consumer, clock: () => boundary + 1_000 });
      let release!: () => void;
      const held = new Promise<void>((r) => {
        release = r;
      });
      let entered!: () => void;
      const inA = new Promise<void>((r) => {
        entered = r;
      });
      const slow = async (tx: Tx, m: Delivery) => {
        await tx.query("INSERT INTO applied (consumer, message_id) VALUES ($1, $2)", [consumer, m.id]);
        entered();
        await held;
      };
      const fast = async (tx: Tx, m: Delivery) => {
        await tx.query("INSERT INTO applied (consumer, message_id) VALUES ($1, $2)", [consumer, m.id]);
      };
      const run = (inbox: Inbox, h: (tx: Tx, m: Delivery) => Promise<void>) =>
        batch
          ? inbox.processBatch([delivery(id), delivery(unique("other"))], h).then((r) => r[0])
          : inbox.process(delivery(id), h);
      const a = run(before, slow);
      await inA;
      const b = run(after, fast);
      await new Promise((r) => setTimeout(r, 200)); // B is now waiting on A's mark
      release();
      expect([await a, await b]).toEqual(["applied", "duplicate"]);
      expect(await appliedCount(db, consumer, id)).toBe(1);
    });
  }
});
