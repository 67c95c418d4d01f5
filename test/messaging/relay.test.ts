/** The outbox relay: every event published at least once and marked, under concurrency, failures and crashes. */
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { outboxCounts, Relay, requeueParked } from "../../src/messaging/relay.ts";
import {
  BrokerUnavailableError,
  type OutboxMessage,
  type Publisher,
  type PublishOutcome,
} from "../../src/messaging/types.ts";
import type { Db } from "../../src/postgres/db.ts";
import { listenWithPg } from "../../src/postgres/drivers/listen.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { backends, type OpenDb, serverBackends } from "../helpers/db.ts";
import { prepare, unique, until, writeCredits } from "./helpers.ts";

/** A publisher that records what it was given; `fail` decides per message (true: fail it). */
function recorder(fail: (m: OutboxMessage) => boolean | "unavailable" = () => false) {
  const published: OutboxMessage[] = [];
  const publisher: Publisher = {
    name: "recorder",
    async publish(batch) {
      await new Promise((r) => setTimeout(r, Math.random() * 5));
      const outcomes: PublishOutcome[] = [];
      for (const m of batch) {
        const f = fail(m);
        if (f === "unavailable") throw new BrokerUnavailableError("broker down");
        if (f) outcomes.push({ ok: false, error: new Error(`refused ${m.topic}`) });
        else {
          published.push(m);
          outcomes.push({ ok: true });
        }
      }
      return outcomes;
    },
    async close() {},
  };
  return { publisher, published };
}

async function rowsOf(db: Db, topic: string) {
  const { rows } = await db.query<{
    id: string;
    published: boolean;
    parked: boolean;
    attempts: number;
    last_error: string | null;
  }>(
    `SELECT id::text, published_at IS NOT NULL AS published, parked_at IS NOT NULL AS parked, attempts, last_error
     FROM idem.outbox WHERE topic = $1 ORDER BY id`,
    [topic],
  );
  return rows;
}

describe.each(backends)("relay on $name", (backend) => {
  let open: OpenDb;
  let db: Db;
  beforeAll(async () => {
    open = await backend.open();
    db = open.db;
    await prepare(db);
  });
  afterAll(() => open?.close());

  it("publishes each committed event with its event id and marks it published; rolled-back events never leave", async () => {
    const topic = unique("t");
    const ids = await writeCredits(db, 1_200, topic);
    await db
      .transaction(async (tx) => {
        await writeOutbox(tx, { topic, type: "never", payload: {} });
        throw new Error("rollback");
      })
      .catch(() => {});
    const { publisher, published } = recorder();
    const relay = new Relay({ db, publisher, topics: [topic], batchSize: 500, pollMs: 20 });
    await relay.start();
    try {
      await until(() => published.length >= 1_200, 15_000, "1,200 publishes");
    } finally {
      await relay.stop();
    }
    expect(published.map((m) => m.id).sort()).toEqual([...ids].sort());
    expect(published.every((m) => m.type === "wallet.credited" && JSON.parse(m.body).cents === 1)).toBe(true);
    expect((await rowsOf(db, topic)).every((r) => r.published)).toBe(true);
  });

  it("retries a failing event with backoff and parks it with its error after maxAttempts; requeued, it goes out", async () => {
    const topic = unique("t");
    const [poison] = await writeCredits(db, 1, topic);
    await writeCredits(db, 20, topic);
    let broken = true;
    const { publisher, published } = recorder((m) => broken && m.id === poison);
    const relay = new Relay({
      db,
      publisher,
      topics: [topic],
      maxAttempts: 3,
      backoff: { baseMs: 10, capMs: 40 },
      pollMs: 10,
    });
    await relay.start();
    try {
      await until(
        async () => (await rowsOf(db, topic)).some((r) => r.parked),
        10_000,
        "the poison row parked",
      );
      const rows = await rowsOf(db, topic);
      const p = rows.find((r) => r.id === poison)!;
      expect(p).toMatchObject({
        published: false,
        parked: true,
        attempts: 3,
        last_error: `refused ${topic}`,
      });
      expect(rows.filter((r) => r.published)).toHaveLength(20);
      expect(relay.stats.parked).toBe(1);
      broken = false;
      expect(await requeueParked(db, { topic })).toBe(1);
      relay.wake();
      await until(() => published.some((m) => m.id === poison), 5_000, "the requeued row published");
    } finally {
      await relay.stop();
    }
    expect((await outboxCounts(db)).parked).toBe(0);
  });

  it("puts a batch back without counting attempts while the broker is unreachable, then publishes it", async () => {
    const topic = unique("t");
    await writeCredits(db, 50, topic);
    let down = true;
    const { publisher, published } = recorder(() => (down ? "unavailable" : false));
    const relay = new Relay({ db, publisher, topics: [topic], maxAttempts: 1, pollMs: 10 });
    await relay.start();
    try {
      await until(() => relay.stats.unavailable >= 2, 5_000, "two unavailable batches");
      expect(
        (await rowsOf(db, topic)).every(
          (r) => r.attempts === 0 && !r.parked && r.last_error === "broker down",
        ),
      ).toBe(true);
      down = false;
      await until(() => published.length === 50, 10_000, "50 publishes after the broker came back");
    } finally {
      await relay.stop();
    }
  });

  it("deletes published rows past retention and keeps the rest", async () => {
    const topic = unique("t");
    const ids = await writeCredits(db, 30, topic);
    const relay = new Relay({ db, publisher: recorder().publisher, topics: [topic], retentionMs: 3_600_000 });
    while ((await relay.runOnce()) > 0) {}
    await db.query(
      "UPDATE idem.outbox SET published_at = now() - interval '2 hours' WHERE id = ANY(string_to_array($1, ',')::uuid[])",
      [ids.slice(0, 10).join(",")],
    );
    expect(await relay.cleanup()).toBe(10);
    expect(await rowsOf(db, topic)).toHaveLength(20);
  });
});

describe.each(serverBackends)("relays side by side on $name", (backend) => {
  let open: OpenDb;
  let db: Db;
  beforeAll(async () => {
    open = await backend.open();
    db = open.db;
    await prepare(db);
  });
  afterAll(() => open?.close());

  it("lets four relays with two loops each share 5,000 events: none lost, none claimed twice", async () => {
    const topic = unique("t");
    const ids = await writeCredits(db, 5_000, topic, 1_000);
    const { publisher, published } = recorder();
    const relays = Array.from(
      { length: 4 },
      () => new Relay({ db, publisher, topics: [topic], batchSize: 200, concurrency: 2, pollMs: 20 }),
    );
    await Promise.all(relays.map((r) => r.start()));
    try {
      await until(() => published.length >= 5_000, 20_000, "5,000 publishes");
    } finally {
      await Promise.all(relays.map((r) => r.stop()));
    }
    expect(published).toHaveLength(5_000);
    expect(new Set(published.map((m) => m.id)).size).toBe(5_000);
    expect(new Set(ids)).toEqual(new Set(published.map((m) => m.id)));
    expect(relays.filter((r) => r.stats.published > 0).length).toBeGreaterThan(1);
  });

  it("publishes the events of one aggregate in the order they were written, despite failures and concurrent relays", async () => {
    const topic = unique("t");
    const aggregates = ["a", "b", "c", "d"];
    await db.transaction(async (tx) => {
      for (let i = 0; i < 200; i++) {
        const agg = aggregates[i % aggregates.length]!;
        await writeOutbox(tx, {
          topic,
          type: "step",
          payload: { i },
          aggregateType: "order",
          aggregateId: agg,
        });
      }
    });
    const firstTry = new Set<string>();
    // Every event's first attempt fails with probability 0.3: a naive relay would let its successor pass it.
    const { publisher, published } = recorder((m) => {
      if (firstTry.has(m.id)) return false;
      firstTry.add(m.id);
      return Math.random() < 0.3;
    });
    const relays = Array.from(
      { length: 3 },
      () =>
        new Relay({
          db,
          publisher,
          topics: [topic],
          orderByAggregate: true,
          batchSize: 50,
          concurrency: 2,
          backoff: { baseMs: 5, capMs: 20 },
          pollMs: 10,
        }),
    );
    await Promise.all(relays.map((r) => r.start()));
    try {
      await until(() => published.length >= 200, 20_000, "200 publishes");
    } finally {
      await Promise.all(relays.map((r) => r.stop()));
    }
    for (const agg of aggregates) {
      const seq = published.filter((m) => m.aggregateId === agg).map((m) => JSON.parse(m.body).i as number);
      expect(seq).toEqual([...seq].sort((x, y) => x - y));
      expect(seq).toHaveLength(50);
    }
  });

  it("holds back only the aggregate (type and id) whose event is backing off", async () => {
    const topic = unique("t");
    const write = (type: string | undefined, id: string, step: string) =>
      db.transaction((tx) =>
        writeOutbox(tx, { topic, type: "step", payload: { step }, aggregateType: type, aggregateId: id }),
      );
    await write("order", "1", "first");
    const { publisher, published } = recorder((m) => JSON.parse(m.body).step === "first");
    const relay = new Relay({
      db,
      publisher,
      topics: [topic],
      orderByAggregate: true,
      backoff: { baseMs: 60_000, capMs: 60_000 },
    });
    expect(await relay.runOnce()).toBe(1); // refused: order/1 backs off for a minute
    await write("order", "1", "held");
    await write("invoice", "1", "other type");
    await write(undefined, "1", "no type");
    await write("order", "2", "other id");
    await relay.runOnce();
    expect(published.map((m) => JSON.parse(m.body).step).sort()).toEqual([
      "no type",
      "other id",
      "other type",
    ]);
    const rows = await rowsOf(db, topic);
    expect(rows.filter((r) => !r.published)).toHaveLength(2); // "first" (backing off) and "held"
  });

  it("wakes on NOTIFY: an event is published within a fraction of the 10 s poll interval", async () => {
    const topic = unique("t");
    const { publisher, published } = recorder();
    const pool = new pg.Pool({ connectionString: open.url, max: 1 });
    const relay = new Relay({
      db,
      publisher,
      topics: [topic],
      pollMs: 10_000,
      listen: listenWithPg(() => pool.connect()),
    });
    await relay.start();
    try {
      await new Promise((r) => setTimeout(r, 100)); // the relay's first look found nothing: it sleeps
      const t0 = Date.now();
      await writeCredits(db, 1, topic);
      await until(() => published.length === 1, 3_000, "the event published");
      expect(Date.now() - t0).toBeLessThan(1_000);
    } finally {
      await relay.stop();
      await pool.end();
    }
  });

  it("republishes what a relay killed between publish and mark left behind, once its lease expires", async () => {
    const topic = unique("t");
    const ids = await writeCredits(db, 300, topic);
    const { publisher, published } = recorder();
    let kills = 0;
    const doomed = new Relay({
      db,
      publisher,
      topics: [topic],
      batchSize: 100,
      leaseMs: 300,
      crash: (point) => point === "after-publish" && kills++ === 0,
    });
    await doomed.start();
    await until(() => !doomed.running, 5_000, "the relay to die");
    await doomed.stop();
    expect(published).toHaveLength(100); // published, never marked
    const survivor = new Relay({ db, publisher, topics: [topic], batchSize: 100, leaseMs: 300, pollMs: 20 });
    await survivor.start();
    try {
      await until(
        async () => (await rowsOf(db, topic)).every((r) => r.published),
        10_000,
        "every row marked",
      );
    } finally {
      await survivor.stop();
    }
    expect(new Set(published.map((m) => m.id))).toEqual(new Set(ids));
    expect(published.length).toBe(400); // the dead relay's 100 went out twice: the inbox absorbs them
  });
});
