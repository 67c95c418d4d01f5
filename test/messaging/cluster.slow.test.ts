/**
 * Issue 16: clustered brokers. 10,000 events over 40 aggregates go outbox -> ordered relay -> broker
 * -> inbox while the broker is hurt mid-stream:
 *   - a 3-node NATS JetStream cluster (started here, on loopback) with a stream of 3 replicas, whose
 *     stream leader is killed -9 and restarted;
 *   - a RabbitMQ quorum queue (single node), whose connections (relay's and consumer's) are cut at
 *     2,500, 5,000 and 7,500 events published.
 * Every event must be applied exactly once, each aggregate's events in the order they were written.
 * The relay runs with its defaults (nothing tuned for failovers) and a poll of 30 s, so that only its
 * own wake-ups can bring it back: publishing must resume within 10 s of the broker answering again
 * (the issue's goal is 2 s beyond the broker's own failover; the time is printed, the bound is loose
 * for a busy machine). Throughput and recovery times are printed.
 */
import { type JetStreamManager, jetstream, jetstreamManager, StorageType } from "@nats-io/jetstream";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import amqp from "amqplib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AmqpPublisher, consumeAmqp } from "../../src/messaging/amqp.ts";
import { Inbox } from "../../src/messaging/inbox.ts";
import { consumeNats, NatsPublisher } from "../../src/messaging/nats.ts";
import { Relay } from "../../src/messaging/relay.ts";
import type { Db } from "../../src/postgres/db.ts";
import { type OpenDb, sayWhySkippedWithoutServer, serverBackends } from "../helpers/db.ts";
import { AMQP_URL, prepare, unique, until } from "./helpers.ts";
import { hasNatsServer, type NatsCluster, startNatsCluster } from "./nats-cluster.ts";
import { orderedEffect, orderedResult, prepareOrdered, writeBacklog } from "./ordered.ts";
import { type CuttableProxy, startProxy } from "./proxy.ts";

sayWhySkippedWithoutServer();

const backend = serverBackends.find((b) => b.name === "pg");
const N = 10_000;
const AGGREGATES = 40;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The relay's defaults, and a poll too long to hide a relay that failed to wake itself. */
const relayOptions = { orderByAggregate: true, pollMs: 30_000 };

/** Resolves with the time (performance.now()) at which `count()` first goes above `from`. */
async function resumed(count: () => number, from: number, what: string): Promise<number> {
  await until(() => count() > from, 30_000, what);
  return performance.now();
}

describe.skipIf(!backend || !hasNatsServer)("a 3-node NATS JetStream cluster", () => {
  let open: OpenDb;
  let db: Db;
  let cluster: NatsCluster;
  let nc: NatsConnection;
  let jsm: JetStreamManager;
  beforeAll(async () => {
    open = await backend!.open();
    db = open.db;
    await prepare(db);
    await prepareOrdered(db);
    cluster = await startNatsCluster();
    nc = await connect({ servers: cluster.urls });
    jsm = await jetstreamManager(nc, { checkAPI: false }); // JetStream answers once a leader is elected
  }, 30_000);
  afterAll(async () => {
    await nc?.close().catch(() => {});
    await cluster?.stop();
    await open?.close();
  });

  it("applies 10,000 events once each, in order per aggregate, while the stream leader is killed -9 and restarted", async () => {
    const stream = unique("IDEM_CLUSTER");
    const subject = `${stream}.events`;
    // The cluster elects its JetStream meta leader within a few seconds of starting.
    await until(
      () =>
        jsm.streams
          .add({ name: stream, subjects: [`${stream}.>`], storage: StorageType.File, num_replicas: 3 })
          .then(() => true)
          .catch(() => false),
      20_000,
      "a stream of 3 replicas",
    );
    await writeBacklog(db, subject, N, AGGREGATES);
    const errors: string[] = [];
    const publisher = new NatsPublisher({ servers: cluster.urls, timeoutMs: 2_000 });
    const relay = new Relay({
      db,
      publisher,
      topics: [subject],
      ...relayOptions,
      onError: (e) => errors.push(e.message),
    });
    const consumer = await consumeNats({
      servers: cluster.urls,
      stream,
      durable: "cluster",
      create: { filterSubject: subject, ackWaitMs: 3_000, maxAckPending: 4_096 },
      inbox: new Inbox(db, { consumer: stream }),
      batchHandler: orderedEffect(stream),
      prefetch: 512,
      batchSize: 500,
      concurrency: 1,
      onError: (e) => errors.push(e.message),
    });
    const t0 = performance.now();
    await relay.start();
    let killed = "";
    let times = "";
    try {
      await until(() => consumer.stats.applied >= N / 2, 30_000, "5,000 effects");
      killed = (await jsm.streams.info(stream)).cluster?.leader ?? cluster.names[0]!;
      const i = cluster.names.indexOf(killed);
      const published = relay.stats.published;
      const applied = consumer.stats.applied;
      const tKill = performance.now();
      cluster.kill(i);
      // The broker's own failover: until a probe publish (another subject of the stream, every
      // 100 ms, its own 500 ms timeout) is stored again.
      let tLeader = 0;
      const js = jetstream(nc);
      const watching = until(
        async () => {
          const sent = performance.now();
          const ok = await js.publish(`${stream}.probe`, "", { timeout: 500 }).then(
            () => true,
            () => false,
          );
          if (ok) tLeader = sent;
          else await sleep(100);
          return ok;
        },
        30_000,
        "the stream to store again",
      );
      await sleep(1_000);
      await cluster.restart(i);
      await watching;
      const tPublished = await resumed(() => relay.stats.published, published, "publishing again");
      const tApplied = await resumed(() => consumer.stats.applied, applied, "applying again");
      const after = (t: number) => `${((Math.max(t, tLeader) - tLeader) / 1000).toFixed(1)} s`;
      times = `the stream stored again ${((tLeader - tKill) / 1000).toFixed(1)} s after the kill; relay publishing ${after(tPublished)} and consumer applying ${after(tApplied)} after that`;
      expect(tPublished - tLeader).toBeLessThan(10_000);
      await until(() => consumer.stats.applied >= N, 45_000, `${N} effects`);
    } finally {
      await relay.stop();
      await consumer.stop();
      await publisher.close();
      await jsm.streams.delete(stream).catch(() => {});
    }
    const seconds = (performance.now() - t0) / 1000;
    console.log(
      `NATS cluster (R3, leader ${killed} killed -9 at 5,000 and restarted): ${N} events in ${seconds.toFixed(1)} s = ${Math.round(N / seconds)} events/s; ${times}; ${relay.stats.unavailable} batches with publishes lost and sent again, ${relay.stats.failed} failed, ${relay.stats.duplicates} dropped by the stream's dedup, ${consumer.stats.duplicates} duplicate deliveries absorbed; first errors: ${errors.slice(0, 3).join(" | ")}`,
    );
    expect(await orderedResult(db, stream)).toEqual({ total: N, distinct: N, outOfOrder: 0 });
  }, 120_000);
});

describe.skipIf(!backend)("a RabbitMQ quorum queue", () => {
  let open: OpenDb;
  let db: Db;
  let admin: amqp.ChannelModel;
  let ch: amqp.Channel;
  let proxy: CuttableProxy;
  const queue = unique("idem_quorum");
  beforeAll(async () => {
    open = await backend!.open();
    db = open.db;
    await prepare(db);
    await prepareOrdered(db);
    admin = await amqp.connect(AMQP_URL);
    ch = await admin.createChannel();
    await ch.assertQueue(queue, { durable: true, arguments: { "x-queue-type": "quorum" } });
    const u = new URL(AMQP_URL);
    proxy = await startProxy({ host: u.hostname, port: Number(u.port || 5672) });
  });
  afterAll(async () => {
    await ch?.deleteQueue(queue).catch(() => {});
    await admin?.close().catch(() => {});
    await proxy?.close();
    await open?.close();
  });

  it("applies 10,000 events once each, in order per aggregate, while every connection is cut three times", async () => {
    await writeBacklog(db, queue, N, AGGREGATES);
    const viaProxy = new URL(AMQP_URL);
    viaProxy.host = `127.0.0.1:${proxy.port}`;
    const publisher = new AmqpPublisher({ url: viaProxy.toString() });
    const relay = new Relay({ db, publisher, topics: [queue], ...relayOptions });
    const consumer = await consumeAmqp({
      url: viaProxy.toString(),
      queue,
      inbox: new Inbox(db, { consumer: queue }),
      batchHandler: orderedEffect(queue),
      prefetch: 512,
      batchSize: 500,
      concurrency: 1,
    });
    const t0 = performance.now();
    const recoveries: number[] = [];
    await relay.start();
    try {
      for (const at of [2_500, 5_000, 7_500]) {
        await until(() => relay.stats.published >= at, 30_000, `${at} published`);
        // Cut while bytes go up (publishes or acks on the wire): the relay's and the consumer's
        // connections, with unconfirmed publishes and unacked deliveries.
        const bytes = proxy.bytesUp;
        await until(() => proxy.bytesUp > bytes, 10_000, "a publish on the wire");
        const published = relay.stats.published;
        const applied = consumer.stats.applied;
        proxy.cut();
        const tCut = performance.now();
        // The broker never went away: recovery is counted from the cut, until both sides move again.
        const tPublished = await resumed(() => relay.stats.published, published, "publishing again");
        const tApplied = await resumed(() => consumer.stats.applied, applied, "applying again");
        recoveries.push(Math.max(tPublished, tApplied) - tCut);
      }
      await until(() => consumer.stats.applied >= N, 45_000, `${N} effects`);
    } finally {
      await relay.stop();
      await consumer.stop();
      await publisher.close();
    }
    const seconds = (performance.now() - t0) / 1000;
    console.log(
      `RabbitMQ quorum queue (connections cut x${proxy.cuts}): ${N} events in ${seconds.toFixed(1)} s = ${Math.round(N / seconds)} events/s; relay and consumer both moving again ${recoveries.map((ms) => `${(ms / 1000).toFixed(1)} s`).join(", ")} after each cut; ${relay.stats.unavailable} batches with publishes lost and sent again, ${relay.stats.failed} failed, ${consumer.stats.duplicates} duplicate deliveries absorbed`,
    );
    for (const ms of recoveries) expect(ms).toBeLessThan(10_000);
    expect(proxy.cuts).toBe(3);
    expect(await orderedResult(db, queue)).toEqual({ total: N, distinct: N, outOfOrder: 0 });
  }, 120_000);
});
