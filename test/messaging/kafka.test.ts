/**
 * Apache Kafka end to end on a real broker: outbox -> relay (idempotent producer, aggregate id as the
 * record key) -> topic -> consumer group -> inbox. The fault tests (killed consumers, rebalances under
 * load, a killed partition leader, a killed relay) are in kafka-faults.slow.test.ts.
 */
import { Admin } from "@platformatic/kafka";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Inbox } from "../../src/messaging/inbox.ts";
import { parkedMessages } from "../../src/messaging/inbox-admin.ts";
import { consumeKafka, KafkaPublisher } from "../../src/messaging/kafka.ts";
import { Relay } from "../../src/messaging/relay.ts";
import type { Db } from "../../src/postgres/db.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { type OpenDb, serverBackends } from "../helpers/db.ts";
import { KAFKA, NO_KAFKA, sayWhySkipped } from "./brokers.ts";
import { prepare, record, unique, until, writeCredits } from "./helpers.ts";
import { orderedEffect, orderedResult, prepareOrdered, writeBacklog } from "./ordered.ts";

sayWhySkipped(NO_KAFKA);

const backend = serverBackends.find((b) => b.name === "pg");

describe.skipIf(NO_KAFKA !== undefined || !backend)("Kafka", () => {
  let open: OpenDb;
  let db: Db;
  let admin: Admin;
  const topics: string[] = [];
  beforeAll(async () => {
    open = await backend!.open();
    db = open.db;
    await prepare(db);
    await prepareOrdered(db);
    admin = new Admin({ clientId: "idem-test", bootstrapBrokers: KAFKA!.split(",") });
  });
  afterAll(async () => {
    if (topics.length > 0) await admin?.deleteTopics({ topics }).catch(() => {});
    await admin?.close();
    await open?.close();
  });
  async function newTopic(partitions = 6): Promise<string> {
    const topic = unique("idem_test");
    topics.push(topic);
    await admin.createTopics({ topics: [topic], partitions, replicas: 1 });
    return topic;
  }
  const unpublished = async (topic: string) =>
    Number(
      (
        await db.query<{ n: string }>(
          "SELECT count(*) AS n FROM idem.outbox WHERE topic = $1 AND published_at IS NULL",
          [topic],
        )
      ).rows[0]!.n,
    );

  it("takes 3,000 events over 30 aggregates through 6 partitions: each applied once, in order per aggregate", async () => {
    const topic = await newTopic();
    await writeBacklog(db, topic, 3_000, 30);
    const publisher = new KafkaPublisher({ brokers: KAFKA! });
    const relay = new Relay({ db, publisher, topics: [topic], orderByAggregate: true, pollMs: 20 });
    const seen: { partition: number; key: string | null; aggregate: string | undefined }[] = [];
    const effect = orderedEffect(topic);
    const consumer = await consumeKafka({
      brokers: KAFKA!,
      topics: topic,
      groupId: topic,
      inbox: new Inbox(db, { consumer: topic }),
      batchHandler: async (tx, messages) => {
        for (const m of messages) {
          seen.push({ partition: m.partition, key: m.key, aggregate: m.headers["idem-aggregate-id"] });
        }
        await effect(tx, messages);
      },
      concurrency: 4,
    });
    await relay.start();
    try {
      await until(() => consumer.stats.applied >= 3_000, 60_000, "3,000 effects");
      await until(async () => (await unpublished(topic)) === 0, 10_000, "every row marked published");
    } finally {
      await relay.stop();
      await consumer.stop();
      await publisher.close();
    }
    expect(await orderedResult(db, topic)).toEqual({ total: 3_000, distinct: 3_000, outOfOrder: 0 });
    // The aggregate id is the record key, so an aggregate's events share one partition.
    const partitionsOf = new Map<string, Set<number>>();
    for (const s of seen) {
      expect(s.key).toBe(s.aggregate);
      partitionsOf.set(s.key!, (partitionsOf.get(s.key!) ?? new Set()).add(s.partition));
    }
    expect([...partitionsOf.values()].every((p) => p.size === 1)).toBe(true);
    expect(new Set(seen.map((s) => s.partition)).size).toBeGreaterThan(1);
  });

  it("absorbs a relay's second publication of the same events: 300 records, 150 effects", async () => {
    const topic = await newTopic(3);
    await writeCredits(db, 150, topic);
    const publisher = new KafkaPublisher({ brokers: KAFKA! });
    try {
      expect(await new Relay({ db, publisher, topics: [topic] }).runOnce()).toBe(150);
      // As if the relay had died before marking: the same rows go out again, same event ids.
      await db.query("UPDATE idem.outbox SET published_at = NULL WHERE topic = $1", [topic]);
      expect(await new Relay({ db, publisher, topics: [topic] }).runOnce()).toBe(150);
    } finally {
      await publisher.close();
    }
    const consumer = await consumeKafka({
      brokers: KAFKA!,
      topics: topic,
      groupId: topic,
      inbox: new Inbox(db, { consumer: topic }),
      handler: record,
    });
    try {
      await until(() => consumer.stats.applied + consumer.stats.duplicates >= 300, 30_000, "300 records");
    } finally {
      await consumer.stop();
    }
    expect(consumer.stats).toMatchObject({ applied: 150, duplicates: 150 });
  });

  it("parks a poison record (visible to idem/admin) without holding back other keys, and refuses a record without idem-id", async () => {
    const topic = await newTopic(1); // one partition: the poison shares it with every other key
    await db.transaction(async (tx) => {
      await writeOutbox(tx, {
        topic,
        type: "bad",
        payload: { agg: "p", seq: 0 },
        aggregateType: "account",
        aggregateId: "p",
      });
      await writeOutbox(tx, {
        topic,
        type: "step",
        payload: { agg: "p", seq: 1 },
        aggregateType: "account",
        aggregateId: "p",
      });
      for (let i = 0; i < 20; i++) {
        await writeOutbox(tx, {
          topic,
          type: "step",
          payload: { agg: `k${i}`, seq: 0 },
          aggregateType: "account",
          aggregateId: `k${i}`,
        });
      }
    });
    const publisher = new KafkaPublisher({ brokers: KAFKA! });
    await new Relay({ db, publisher, topics: [topic] }).runOnce();
    await publisher.close();
    const { Producer, stringSerializers } = await import("@platformatic/kafka");
    const raw = new Producer({
      clientId: "raw",
      bootstrapBrokers: KAFKA!.split(","),
      serializers: stringSerializers,
    });
    await raw.send({ messages: [{ topic, key: "x", value: "{}" }] }); // no idem-id header
    await raw.close();
    const effect = orderedEffect(topic);
    const order: string[] = [];
    const inbox = new Inbox(db, { consumer: topic, maxAttempts: 3 });
    const consumer = await consumeKafka({
      brokers: KAFKA!,
      topics: topic,
      groupId: topic,
      inbox,
      retryDelayMs: 300,
      handler: async (tx, m) => {
        if (m.type === "bad") throw new Error("cannot render receipt");
        order.push(m.key!);
        await effect(tx, [m]);
      },
    });
    try {
      await until(
        () => consumer.stats.parked === 1 && consumer.stats.applied === 21,
        20_000,
        "parked and 21 applied",
      );
    } finally {
      await consumer.stop();
    }
    expect(consumer.stats.refused).toBe(1);
    // The other 20 keys went by while "p" waited for its retries; "p"'s next event came after its parking.
    expect(order.indexOf("p")).toBe(20);
    const parked = await parkedMessages(db, { consumer: topic });
    expect(parked).toHaveLength(1);
    expect(parked[0]).toMatchObject({ topic, type: "bad", attempts: 3, lastError: "cannot render receipt" });
    expect(parked[0]!.headers["idem-aggregate-id"]).toBe("p");
  });

  it("pipelines an ordered relay's batches (keepsOrder) and carries the event's headers", async () => {
    const topic = await newTopic(4);
    const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    await db.transaction(async (tx) => {
      for (let i = 0; i < 200; i++) {
        await writeOutbox(tx, {
          topic,
          type: "step",
          payload: { agg: `a${i % 5}`, seq: Math.floor(i / 5) },
          aggregateType: "account",
          aggregateId: `a${i % 5}`,
          headers: { traceparent },
        });
      }
    });
    const publisher = new KafkaPublisher({ brokers: KAFKA! });
    const relay = new Relay({ db, publisher, topics: [topic], orderByAggregate: true, pipeline: true });
    expect(await relay.runOnce()).toBe(200);
    await publisher.close();
    const headers: Record<string, string>[] = [];
    const effect = orderedEffect(`${topic}-p`);
    const consumer = await consumeKafka({
      brokers: KAFKA!,
      topics: [topic],
      groupId: topic,
      inbox: new Inbox(db, { consumer: `${topic}-p` }),
      batchHandler: async (tx, ms) => {
        headers.push(...ms.map((m) => m.headers));
        await effect(tx, ms);
      },
    });
    try {
      await until(() => consumer.stats.applied >= 200, 20_000, "200 effects");
    } finally {
      await consumer.stop();
    }
    expect(relay.stats).toMatchObject({ published: 200, reordered: 0 });
    expect(await orderedResult(db, `${topic}-p`)).toEqual({ total: 200, distinct: 200, outOfOrder: 0 });
    expect(headers.every((h) => h.traceparent === traceparent && h["idem-type"] === "step")).toBe(true);
  });
});
