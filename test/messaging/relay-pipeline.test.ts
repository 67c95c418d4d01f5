/**
 * The pipelined ordered relay (`pipeline: true`): a batch goes out in one call, and each aggregate's
 * order is still what a consumer applies, on the real RabbitMQ and NATS JetStream. What it cannot undo
 * (a refused event followed by a stored one of its aggregate) is counted, and the rest held behind it.
 */
import { jetstreamManager, StorageType } from "@nats-io/jetstream";
import amqp from "amqplib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AmqpPublisher, consumeAmqp } from "../../src/messaging/amqp.ts";
import { Inbox } from "../../src/messaging/inbox.ts";
import { connectNats, consumeNats, NatsPublisher } from "../../src/messaging/nats.ts";
import { Relay } from "../../src/messaging/relay.ts";
import type { OutboxMessage, Publisher, PublishOutcome } from "../../src/messaging/types.ts";
import type { Db } from "../../src/postgres/db.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { backends, type OpenDb, serverBackends } from "../helpers/db.ts";
import { AMQP_URL, NATS_URL, prepare, unique, until } from "./helpers.ts";
import { orderedEffect, orderedResult, prepareOrdered, writeBacklog } from "./ordered.ts";

/** Counts the publish calls and the messages of each, passing them on to `inner`. */
function counting(inner: Publisher) {
  const calls: number[] = [];
  const publisher: Publisher = {
    name: inner.name,
    keepsOrder: inner.keepsOrder,
    publish: (ms) => {
      calls.push(ms.length);
      return inner.publish(ms);
    },
    close: () => inner.close(),
  };
  return { publisher, calls };
}

// The relay's SQL is the same as without pipeline (relay-batches.test.ts runs it on every driver): one here.
const pglite = backends.filter((b) => b.name === "pglite");

describe.each(pglite)("pipelined ordered relay on $name", (backend) => {
  let open: OpenDb;
  let db: Db;
  beforeAll(async () => {
    open = await backend.open();
    db = open.db;
    await prepare(db);
  });
  afterAll(() => open?.close());

  it("needs a publisher that keeps order", () => {
    const publisher: Publisher = { name: "webhook-like", publish: async () => [], close: async () => {} };
    expect(() => new Relay({ db, publisher, orderByAggregate: true, pipeline: true })).toThrow(/keeps order/);
    // Without orderByAggregate, pipeline changes nothing and asks nothing.
    expect(() => new Relay({ db, publisher, pipeline: true })).not.toThrow();
  });

  it("sends a batch in one call; a refused event holds its aggregate's later refused ones, counts a stored one", async () => {
    const topic = unique("t");
    const [A, B] = [unique("A"), unique("B")];
    const ids: string[] = [];
    for (const agg of [A, B, A, A, B, A]) {
      ids.push(
        await db.transaction((tx) =>
          writeOutbox(tx, { topic, type: "step", payload: {}, aggregateType: "order", aggregateId: agg }),
        ),
      );
    }
    const [a1, b1, a2, a3, b2, a4] = ids;
    // The broker refuses a1 and a3, stores the rest: a2 got in ahead of a1's retry.
    const verdict = (m: OutboxMessage): PublishOutcome =>
      m.id === a1 || m.id === a3 ? { ok: false, error: new Error("queue full") } : { ok: true };
    const calls: string[][] = [];
    const publisher: Publisher = {
      name: "recorder",
      keepsOrder: true,
      publish: async (ms) => {
        calls.push(ms.map((m) => m.id));
        return ms.map(verdict);
      },
      close: async () => {},
    };
    const errors: string[] = [];
    const relay = new Relay({
      db,
      publisher,
      topics: [topic],
      orderByAggregate: true,
      pipeline: true,
      backoff: { baseMs: 100_000, capMs: 100_000 },
      onError: (e) => errors.push(e.message),
    });
    expect(await relay.runOnce()).toBe(6);
    expect(calls).toEqual([[a1, b1, a2, a3, b2, a4]]);
    expect(relay.stats).toMatchObject({ published: 4, failed: 1, reordered: 2 });
    expect(errors).toContain("2 event(s) stored after an earlier one of theirs failed");
    const { rows } = await db.query<{ id: string; published: boolean; attempts: number; locked: boolean }>(
      `SELECT id::text, published_at IS NOT NULL AS published, attempts, locked_until > now() AS locked
       FROM idem.outbox WHERE topic = $1 ORDER BY id`,
      [topic],
    );
    const state = Object.fromEntries(
      rows.map((r) => [r.id, [r.published, Number(r.attempts), r.locked === true]]),
    );
    expect(state[a1!]).toEqual([false, 1, true]); // backing off
    expect(state[a3!]).toEqual([false, 0, false]); // put back without an attempt, held behind a1
    for (const id of [b1, a2, b2, a4]) expect(state[id!]![0]).toBe(true);
    expect(await relay.runOnce()).toBe(0); // A is held while a1 backs off
  });
});

const pg = serverBackends.find((b) => b.name === "pg");

describe.skipIf(!pg)("pipelined ordered relay to real brokers", () => {
  let open: OpenDb;
  let db: Db;
  beforeAll(async () => {
    open = await pg!.open();
    db = open.db;
    await prepare(db);
    await prepareOrdered(db);
  });
  afterAll(() => open?.close());

  const N = 2_000;
  const AGGREGATES = 20;

  /** N events over AGGREGATES aggregates, relayed in batches of 500 while `consume` applies them. */
  async function drain(
    topic: string,
    inner: Publisher,
    consume: (
      inbox: Inbox,
      consumer: string,
    ) => Promise<{ stats: { applied: number }; stop(): Promise<void> }>,
  ) {
    const name = unique("c");
    await writeBacklog(db, topic, N, AGGREGATES);
    const { publisher, calls } = counting(inner);
    const relay = new Relay({
      db,
      publisher,
      topics: [topic],
      orderByAggregate: true,
      pipeline: true,
      pollMs: 50,
    });
    const consumer = await consume(new Inbox(db, { consumer: name }), name);
    await relay.start();
    try {
      await until(() => consumer.stats.applied >= N, 30_000, `${N} ordered effects`);
    } finally {
      await relay.stop();
      await consumer.stop();
      await publisher.close();
    }
    expect(await orderedResult(db, name)).toEqual({ total: N, distinct: N, outOfOrder: 0 });
    expect(relay.stats.reordered).toBe(0);
    // Whole batches, not a call per event: 2,000 events over 20 aggregates would be 2,000 chained calls.
    expect(calls.length).toBeLessThanOrEqual(relay.stats.batches);
    expect(Math.max(...calls)).toBeGreaterThan(AGGREGATES);
  }

  it("RabbitMQ: each event applied once, each aggregate in order", async () => {
    const queue = unique("idem_pipe");
    const admin = await amqp.connect(AMQP_URL);
    const ch = await admin.createChannel();
    await ch.assertQueue(queue, { durable: false });
    try {
      await drain(queue, new AmqpPublisher({ url: AMQP_URL }), (inbox, name) =>
        consumeAmqp({ url: AMQP_URL, queue, inbox, batchHandler: orderedEffect(name), concurrency: 1 }),
      );
    } finally {
      await ch.deleteQueue(queue).catch(() => {});
      await admin.close();
    }
  });

  it("NATS JetStream: each event applied once, each aggregate in order", async () => {
    const stream = unique("IDEM_PIPE");
    const nc = await connectNats(NATS_URL);
    const jsm = await jetstreamManager(nc);
    await jsm.streams.add({ name: stream, subjects: [`${stream}.>`], storage: StorageType.Memory });
    const subject = `${stream}.events`;
    try {
      await drain(subject, new NatsPublisher({ connection: nc }), (inbox, name) =>
        consumeNats({
          connection: nc,
          stream,
          durable: name,
          create: { filterSubject: subject },
          inbox,
          batchHandler: orderedEffect(name),
          concurrency: 1,
        }),
      );
    } finally {
      await jsm.streams.delete(stream).catch(() => {});
      await nc.close();
    }
  });
});
