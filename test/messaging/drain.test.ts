/**
 * Issue 16: an ordered relay drains a backlog at full speed. 10,000 events over 40 aggregates wait in
 * the outbox with no new commits; relay (orderByAggregate) and consumer then run through NATS
 * JetStream. Every event must be applied once, in order per aggregate. The rate is printed (the bench
 * reports it too); it is not asserted, as the machine is shared.
 */
import { type JetStreamManager, jetstreamManager, StorageType } from "@nats-io/jetstream";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Inbox } from "../../src/messaging/inbox.ts";
import { consumeNats, NatsPublisher } from "../../src/messaging/nats.ts";
import { Relay } from "../../src/messaging/relay.ts";
import type { Db } from "../../src/postgres/db.ts";
import { type OpenDb, sayWhySkippedWithoutServer, serverBackends } from "../helpers/db.ts";
import { NATS_URL, prepare, unique, until } from "./helpers.ts";
import { orderedEffect, orderedResult, prepareOrdered, writeBacklog } from "./ordered.ts";

sayWhySkippedWithoutServer();

const backend = serverBackends.find((b) => b.name === "pg");

describe.skipIf(!backend)("an ordered backlog", () => {
  let open: OpenDb;
  let db: Db;
  let nc: NatsConnection;
  let jsm: JetStreamManager;
  let stream = "";
  beforeAll(async () => {
    open = await backend!.open();
    db = open.db;
    await prepare(db);
    await prepareOrdered(db);
    nc = await connect({ servers: NATS_URL });
    jsm = await jetstreamManager(nc);
  });
  afterAll(async () => {
    if (stream) await jsm.streams.delete(stream).catch(() => {});
    await nc?.close();
    await open?.close();
  });

  it("drains 10,000 events over 40 aggregates without waiting for the poll, each applied once and in order", async () => {
    stream = unique("IDEM_DRAIN");
    const subject = `${stream}.events`;
    await jsm.streams.add({ name: stream, subjects: [`${stream}.>`], storage: StorageType.Memory });
    const n = 10_000;
    await writeBacklog(db, subject, n, 40);
    const publisher = new NatsPublisher({ servers: NATS_URL });
    // pollMs of a minute: were the relay to sleep after a short batch (40 events), this would not finish.
    const relay = new Relay({ db, publisher, topics: [subject], orderByAggregate: true, pollMs: 60_000 });
    const consumer = await consumeNats({
      servers: NATS_URL,
      stream,
      durable: "drain",
      create: { filterSubject: subject, maxAckPending: 4_096 },
      inbox: new Inbox(db, { consumer: stream }),
      batchHandler: orderedEffect(stream),
      prefetch: 1_024,
      batchSize: 500,
      concurrency: 1, // one transaction at a time keeps the stream's order
    });
    const t0 = performance.now();
    await relay.start();
    try {
      await until(() => consumer.stats.applied >= n, 40_000, `${n} effects`);
    } finally {
      await relay.stop();
      await consumer.stop();
      await publisher.close();
    }
    const seconds = (performance.now() - t0) / 1000;
    console.log(
      `ordered backlog drain: ${n} events in ${seconds.toFixed(2)} s = ${Math.round(n / seconds)} events/s`,
    );
    expect(await orderedResult(db, stream)).toEqual({ total: n, distinct: n, outOfOrder: 0 });
    expect(relay.stats.published).toBe(n);
  }, 90_000);
});
