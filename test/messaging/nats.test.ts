/** NATS JetStream end to end: outbox -> relay -> stream (msgID dedup) -> durable consumer -> inbox. */
import { type JetStreamManager, jetstreamManager, StorageType } from "@nats-io/jetstream";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Inbox } from "../../src/messaging/inbox.ts";
import { consumeNats, NatsPublisher } from "../../src/messaging/nats.ts";
import { Relay } from "../../src/messaging/relay.ts";
import type { Db } from "../../src/postgres/db.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { type OpenDb, sayWhySkippedWithoutServer, serverBackends } from "../helpers/db.ts";
import { NATS_URL, prepare, record, unique, until, writeCredits } from "./helpers.ts";
import { type CuttableProxy, startProxy } from "./proxy.ts";

sayWhySkippedWithoutServer();

const backend = serverBackends.find((b) => b.name === "pg");

describe.skipIf(!backend)("NATS JetStream", () => {
  let open: OpenDb;
  let db: Db;
  let nc: NatsConnection;
  let jsm: JetStreamManager;
  const streams: string[] = [];
  beforeAll(async () => {
    open = await backend!.open();
    db = open.db;
    await prepare(db);
    nc = await connect({ servers: NATS_URL });
    jsm = await jetstreamManager(nc);
  });
  afterAll(async () => {
    for (const s of streams) await jsm.streams.delete(s).catch(() => {});
    await nc?.close();
    await open?.close();
  });
  /** A stream of its own capturing `<name>.>`; returns its name and a subject in it. */
  async function newStream(): Promise<{ stream: string; subject: string }> {
    const stream = unique("IDEM_TEST");
    streams.push(stream);
    await jsm.streams.add({ name: stream, subjects: [`${stream}.>`], storage: StorageType.Memory });
    return { stream, subject: `${stream}.events` };
  }
  async function effectsOf(consumer: string) {
    const { rows } = await db.query<{ distinct: string; total: string }>(
      `SELECT count(DISTINCT e.message_id) AS distinct, count(*) AS total
       FROM effects e JOIN idem.inbox i USING (message_id) WHERE i.consumer = $1 AND i.status <> 'marker'`,
      [consumer],
    );
    return { distinct: Number(rows[0]!.distinct), total: Number(rows[0]!.total) };
  }

  it("delivers 2,000 events through a durable consumer, each applied once, and marks them published", async () => {
    const { stream, subject } = await newStream();
    const ids = await writeCredits(db, 2_000, subject);
    const publisher = new NatsPublisher({ servers: NATS_URL });
    const relay = new Relay({ db, publisher, topics: [subject], pollMs: 20 });
    const consumer = await consumeNats({
      servers: NATS_URL,
      stream,
      durable: "receipts",
      create: { filterSubject: subject },
      inbox: new Inbox(db, { consumer: stream }),
      handler: record,
    });
    await relay.start();
    try {
      await until(() => consumer.stats.applied >= 2_000, 20_000, "2,000 effects");
    } finally {
      await relay.stop();
      await consumer.stop();
      await publisher.close();
    }
    const { rows } = await db.query<{ message_id: string }>(
      "SELECT message_id FROM effects e JOIN idem.inbox i USING (message_id) WHERE i.consumer = $1 AND i.status <> 'marker'",
      [stream],
    );
    expect(new Set(rows.map((r) => r.message_id))).toEqual(new Set(ids));
    expect(rows).toHaveLength(2_000);
  });

  it("reports an event published twice as a duplicate in the ack and stores it once", async () => {
    const { stream, subject } = await newStream();
    await writeCredits(db, 50, subject);
    const publisher = new NatsPublisher({ servers: NATS_URL });
    try {
      const relay = new Relay({ db, publisher, topics: [subject] });
      expect(await relay.runOnce()).toBe(50);
      // As if the relay had died before marking: the rows go out again with the same msgID.
      await db.query("UPDATE idem.outbox SET published_at = NULL WHERE topic = $1", [subject]);
      const again = new Relay({ db, publisher, topics: [subject] });
      expect(await again.runOnce()).toBe(50);
      expect(again.stats).toMatchObject({ published: 50, duplicates: 50 });
    } finally {
      await publisher.close();
    }
    expect((await jsm.streams.info(stream)).state.messages).toBe(50);
  });

  it("parks a poison message after maxAttempts and terminates it; terminates a message without Nats-Msg-Id", async () => {
    const { stream, subject } = await newStream();
    await db.transaction((tx) => writeOutbox(tx, { topic: subject, type: "bad", payload: { cents: 1 } }));
    const publisher = new NatsPublisher({ servers: NATS_URL });
    await new Relay({ db, publisher, topics: [subject] }).runOnce();
    await publisher.close();
    nc.publish(subject, '{"cents":1}'); // plain NATS publish: no message id
    await nc.flush();
    const inbox = new Inbox(db, { consumer: stream, maxAttempts: 3 });
    const consumer = await consumeNats({
      connection: nc,
      stream,
      durable: "receipts",
      create: { filterSubject: subject },
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
    await until(
      async () => (await jsm.consumers.info(stream, "receipts")).num_ack_pending === 0,
      5_000,
      "nothing left unacked",
    );
  });

  describe("with the connection cut mid-batch", () => {
    let proxy: CuttableProxy;
    beforeAll(async () => {
      const u = new URL(NATS_URL);
      proxy = await startProxy({ host: u.hostname, port: Number(u.port || 4222) });
    });
    afterAll(() => proxy?.close());

    it("loses nothing: unacked publishes go out again, JetStream and the inbox absorb the copies", async () => {
      const { stream, subject } = await newStream();
      const n = 4_000;
      await writeCredits(db, n, subject, 1_000);
      const publisher = new NatsPublisher({
        servers: `nats://127.0.0.1:${proxy.port}`,
        timeoutMs: 2_000,
        connectOptions: { reconnectTimeWait: 50 },
      });
      const relay = new Relay({ db, publisher, topics: [subject], batchSize: 400, pollMs: 20 });
      const consumer = await consumeNats({
        servers: NATS_URL,
        stream,
        durable: "receipts",
        create: { filterSubject: subject },
        inbox: new Inbox(db, { consumer: stream }),
        handler: record,
      });
      let next = proxy.bytesUp + 150_000;
      const cutter = setInterval(() => {
        if (proxy.cuts < 3 && proxy.bytesUp > next) {
          proxy.cut();
          next = proxy.bytesUp + 150_000;
        }
      }, 1);
      await relay.start();
      try {
        await until(
          async () =>
            Number(
              (
                await db.query<{ n: string }>(
                  "SELECT count(*) AS n FROM idem.outbox WHERE topic = $1 AND published_at IS NULL",
                  [subject],
                )
              ).rows[0]!.n,
            ) === 0,
          30_000,
          "every row marked published",
        );
        await until(() => consumer.stats.applied >= n, 20_000, `${n} effects`);
      } finally {
        clearInterval(cutter);
        await relay.stop();
        await publisher.close();
        await consumer.stop();
      }
      expect(proxy.cuts).toBe(3);
      expect(await effectsOf(stream)).toEqual({ distinct: n, total: n });
      expect((await jsm.streams.info(stream)).state.messages).toBe(n); // msgID dedup kept one copy each
      console.log(
        `NATS cut x${proxy.cuts}: ${relay.stats.unavailable} batches lost messages in flight and sent them again, ${relay.stats.duplicates} reported duplicate by JetStream`,
      );
    });
  });
});
