/** RabbitMQ end to end: outbox -> relay -> confirm channel -> queue -> consumer -> inbox. */
import amqp from "amqplib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AmqpPublisher, consumeAmqp } from "../../src/messaging/amqp.ts";
import { Inbox } from "../../src/messaging/inbox.ts";
import { Relay } from "../../src/messaging/relay.ts";
import { BrokerUnavailableError } from "../../src/messaging/types.ts";
import type { Db } from "../../src/postgres/db.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { type OpenDb, sayWhySkippedWithoutServer, serverBackends } from "../helpers/db.ts";
import { AMQP_URL, effectCounts, prepare, record, unique, until, writeCredits } from "./helpers.ts";
import { type CuttableProxy, startProxy } from "./proxy.ts";

sayWhySkippedWithoutServer();

const backend = serverBackends.find((b) => b.name === "pg");

describe.skipIf(!backend)("RabbitMQ", () => {
  let open: OpenDb;
  let db: Db;
  let admin: amqp.ChannelModel;
  let ch: amqp.Channel;
  const queues: string[] = [];
  beforeAll(async () => {
    open = await backend!.open();
    db = open.db;
    await prepare(db);
    admin = await amqp.connect(AMQP_URL);
    ch = await admin.createChannel();
  });
  afterAll(async () => {
    for (const q of queues) await ch.deleteQueue(q).catch(() => {});
    await admin?.close();
    await open?.close();
  });
  async function newQueue(): Promise<string> {
    const q = unique("idem_test");
    queues.push(q);
    await ch.assertQueue(q, { durable: false });
    return q;
  }
  async function outboxDone(topic: string): Promise<boolean> {
    const { rows } = await db.query<{ n: string }>(
      "SELECT count(*) AS n FROM idem.outbox WHERE topic = $1 AND published_at IS NULL",
      [topic],
    );
    return Number(rows[0]!.n) === 0;
  }

  it("delivers 2,000 events with the event id as messageId, each applied once, and marks them published", async () => {
    const queue = await newQueue();
    const ids = await writeCredits(db, 2_000, queue);
    const publisher = new AmqpPublisher({ url: AMQP_URL });
    const relay = new Relay({ db, publisher, topics: [queue], pollMs: 20 });
    const consumer = await consumeAmqp({
      url: AMQP_URL,
      queue,
      prefetch: 50,
      inbox: new Inbox(db, { consumer: queue }),
      handler: record,
    });
    await relay.start();
    try {
      await until(() => consumer.stats.applied >= 2_000, 20_000, "2,000 effects");
      await until(() => outboxDone(queue), 5_000, "every row marked published");
    } finally {
      await relay.stop();
      await consumer.stop();
      await publisher.close();
    }
    const { rows } = await db.query<{ message_id: string }>(
      "SELECT message_id FROM effects e JOIN idem.inbox i USING (message_id) WHERE i.consumer = $1 AND i.status <> 'marker'",
      [queue],
    );
    expect(new Set(rows.map((r) => r.message_id))).toEqual(new Set(ids));
    expect(rows).toHaveLength(2_000);
  });

  it("counts an unroutable message as a failure instead of losing it", async () => {
    const topic = unique("no_such_queue");
    await writeCredits(db, 3, topic);
    const publisher = new AmqpPublisher({ url: AMQP_URL });
    const relay = new Relay({ db, publisher, topics: [topic] });
    try {
      expect(await relay.runOnce()).toBe(3);
    } finally {
      await publisher.close();
    }
    const { rows } = await db.query<{ attempts: number; last_error: string; published_at: Date | null }>(
      "SELECT attempts, last_error, published_at FROM idem.outbox WHERE topic = $1",
      [topic],
    );
    expect(rows).toHaveLength(3);
    for (const r of rows) {
      expect(r).toMatchObject({ attempts: 1, published_at: null });
      expect(r.last_error).toMatch(/unroutable/);
    }
  });

  it("parks a poison message after maxAttempts and acks it; rejects a message without messageId", async () => {
    const queue = await newQueue();
    await db.transaction((tx) => writeOutbox(tx, { topic: queue, type: "bad", payload: { cents: 1 } }));
    ch.sendToQueue(queue, Buffer.from('{"cents":1}')); // no messageId: cannot be deduplicated
    const publisher = new AmqpPublisher({ url: AMQP_URL });
    const relay = new Relay({ db, publisher, topics: [queue] });
    await relay.runOnce();
    await publisher.close();
    const inbox = new Inbox(db, { consumer: queue, maxAttempts: 3 });
    const consumer = await consumeAmqp({
      url: AMQP_URL,
      queue,
      retryDelayMs: 10,
      inbox,
      handler: async () => {
        throw new Error("cannot render receipt");
      },
    });
    try {
      await until(
        () => consumer.stats.parked === 1 && consumer.stats.refused === 1,
        10_000,
        "parked and refused",
      );
    } finally {
      await consumer.stop();
    }
    expect(consumer.stats.retried).toBe(2);
    expect((await inbox.parked())[0]).toMatchObject({
      attempts: 3,
      lastError: "cannot render receipt",
      type: "bad",
    });
    expect((await ch.checkQueue(queue)).messageCount).toBe(0);
  });

  it("consuming a queue that does not exist fails with the broker's reason as the cause, and says the fix", async () => {
    const queue = unique("idem_missing");
    const errors: Error[] = [];
    const failure = await consumeAmqp({
      url: AMQP_URL,
      queue,
      inbox: new Inbox(db, { consumer: queue }),
      handler: record,
      onError: (e) => errors.push(e),
    }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(failure).toBeInstanceOf(BrokerUnavailableError);
    const err = failure as BrokerUnavailableError;
    // The broker's own words (404 NOT_FOUND, the queue's name) are in the message and kept as the cause.
    expect(err.message).toContain(`cannot consume ${queue} from RabbitMQ`);
    expect(err.message).toMatch(/NOT_FOUND/);
    expect(err.message).toContain(`ch.assertQueue("${queue}")`);
    expect(err.cause).toBeInstanceOf(Error);
    expect((err.cause as { code?: number }).code).toBe(404);
    // onError heard it too (the channel's close, then the refused consume), and nothing else.
    expect(errors).toContain(err.cause);
    for (const e of errors) expect((e as { code?: number }).code).toBe(404);
  });

  describe("with the connection cut mid-batch", () => {
    let proxy: CuttableProxy;
    beforeAll(async () => {
      const u = new URL(AMQP_URL);
      proxy = await startProxy({ host: u.hostname, port: Number(u.port || 5672) });
    });
    afterAll(() => proxy?.close());

    it("relay.stop() closes the publisher's connection: nothing of the relay's stays open", async () => {
      const queue = await newQueue();
      await writeCredits(db, 5, queue);
      const viaProxy = new URL(AMQP_URL);
      viaProxy.host = `127.0.0.1:${proxy.port}`;
      const relay = new Relay({
        db,
        publisher: new AmqpPublisher({ url: viaProxy.toString() }),
        topics: [queue],
      });
      await relay.start();
      try {
        await until(() => outboxDone(queue), 10_000, "the events published");
        expect(proxy.open).toBe(1);
      } finally {
        await relay.stop();
      }
      await until(() => proxy.open === 0, 5_000, "the publisher's connection closed by relay.stop()");
      expect((await ch.checkQueue(queue)).messageCount).toBe(5);
    });

    it("loses nothing: unconfirmed messages are published again and the copies are absorbed by the inbox", async () => {
      const queue = await newQueue();
      const n = 4_000;
      await writeCredits(db, n, queue, 1_000);
      const viaProxy = new URL(AMQP_URL);
      viaProxy.host = `127.0.0.1:${proxy.port}`;
      const publisher = new AmqpPublisher({ url: viaProxy.toString() });
      const relay = new Relay({ db, publisher, topics: [queue], batchSize: 400, pollMs: 20 });
      const consumer = await consumeAmqp({
        url: AMQP_URL,
        queue,
        prefetch: 100,
        inbox: new Inbox(db, { consumer: queue }),
        handler: record,
      });
      // Cut whenever a batch is on the wire: three times, each once 200 kB more went up.
      let next = proxy.bytesUp + 200_000;
      const cutter = setInterval(() => {
        if (proxy.cuts < 3 && proxy.bytesUp > next) {
          proxy.cut();
          next = proxy.bytesUp + 200_000;
        }
      }, 1);
      await relay.start();
      try {
        await until(() => outboxDone(queue), 30_000, "every row marked published");
        await until(() => consumer.stats.applied >= n, 20_000, `${n} effects`);
      } finally {
        clearInterval(cutter);
        await relay.stop();
        await publisher.close();
        await until(async () => (await ch.checkQueue(queue)).messageCount === 0, 10_000, "the queue drained");
        await consumer.stop();
      }
      expect(proxy.cuts).toBe(3);
      // The messages in flight were lost with the connection: put back without an attempt, sent again.
      expect(relay.stats.unavailable).toBeGreaterThan(0);
      expect(relay.stats.failed).toBe(0);
      const { rows } = await db.query<{ distinct: string; total: string }>(
        `SELECT count(DISTINCT e.message_id) AS distinct, count(*) AS total
         FROM effects e JOIN idem.inbox i USING (message_id) WHERE i.consumer = $1 AND i.status <> 'marker'`,
        [queue],
      );
      expect(Number(rows[0]!.distinct)).toBe(n); // none lost
      expect(Number(rows[0]!.total)).toBe(n); // none applied twice
      console.log(
        `RabbitMQ cut x${proxy.cuts}: ${relay.stats.unavailable} batches lost messages in flight and sent them again, ${consumer.stats.duplicates} duplicate deliveries absorbed`,
      );
      expect(await effectCounts(db)).toMatchObject({ repeated: 0 });
    });
  });
});
