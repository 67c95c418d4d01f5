/**
 * The whole chain under failure: 10,000 events through outbox -> relay -> broker -> consumer -> inbox,
 * with relays killed at random points (between claim and publish, between publish and mark) and
 * consumers dying after their commit but before their ack. Supervisors restart whatever died, as a
 * process manager would. At the end every event's effect must be applied exactly once: none lost,
 * none twice.
 */
import { jetstreamManager, StorageType } from "@nats-io/jetstream";
import { connect as natsConnect } from "@nats-io/transport-node";
import amqp from "amqplib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AmqpPublisher, consumeAmqp } from "../../src/messaging/amqp.ts";
import type { ConsumerOptions, RunningConsumer } from "../../src/messaging/consumer.ts";
import { Inbox } from "../../src/messaging/inbox.ts";
import { consumeNats, NatsPublisher } from "../../src/messaging/nats.ts";
import { Relay } from "../../src/messaging/relay.ts";
import type { Publisher } from "../../src/messaging/types.ts";
import type { Db } from "../../src/postgres/db.ts";
import { uuidv7 } from "../../src/postgres/uuid7.ts";
import { createRng } from "../../src/testing/prng.ts";
import { type OpenDb, sayWhySkippedWithoutServer, serverBackends } from "../helpers/db.ts";
import { AMQP_URL, NATS_URL, prepare, record, unique, until } from "./helpers.ts";

sayWhySkippedWithoutServer();

const backend = serverBackends.find((b) => b.name === "pg");
const EVENTS = 10_000;

interface Transport {
  topic: string;
  publisher(): Publisher;
  consume(options: ConsumerOptions): Promise<RunningConsumer>;
  cleanup(): Promise<void>;
}

async function rabbitTransport(): Promise<Transport> {
  const queue = unique("idem_chaos");
  const admin = await amqp.connect(AMQP_URL);
  const ch = await admin.createChannel();
  await ch.assertQueue(queue, { durable: false });
  return {
    topic: queue,
    publisher: () => new AmqpPublisher({ url: AMQP_URL }),
    consume: (options) => consumeAmqp({ ...options, url: AMQP_URL, queue }),
    async cleanup() {
      await ch.deleteQueue(queue).catch(() => {});
      await admin.close();
    },
  };
}

async function natsTransport(): Promise<Transport> {
  const stream = unique("IDEM_CHAOS");
  const nc = await natsConnect({ servers: NATS_URL });
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({ name: stream, subjects: [`${stream}.>`], storage: StorageType.Memory });
  const topic = `${stream}.events`;
  return {
    topic,
    publisher: () => new NatsPublisher({ servers: NATS_URL }),
    consume: (options) =>
      consumeNats({
        ...options,
        servers: NATS_URL,
        stream,
        durable: "chaos",
        // A dead consumer's messages come back after 1 s (a live one acks long before).
        create: { filterSubject: topic, ackWaitMs: 1_000, maxAckPending: 2_000 },
      }),
    async cleanup() {
      await jsm.streams.delete(stream).catch(() => {});
      await nc.close();
    },
  };
}

/** Insert events in bulk (the writer itself is tested elsewhere; here the chain behind it is). */
async function produce(db: Db, topic: string, n: number): Promise<string[]> {
  const ids: string[] = [];
  for (let done = 0; done < n; done += 1_000) {
    const chunk = Array.from({ length: Math.min(1_000, n - done) }, () => uuidv7());
    await db.query(
      `INSERT INTO idem.outbox (id, topic, type, payload)
       SELECT id::uuid, $2::text, 'wallet.credited', '{"cents":1}'::jsonb
       FROM jsonb_array_elements_text($1::text::jsonb) AS t(id)`,
      [JSON.stringify(chunk), topic],
    );
    ids.push(...chunk);
    await new Promise((r) => setTimeout(r, 20)); // the chain runs while events keep arriving
  }
  return ids;
}

describe.skipIf(!backend)("exactly-once effects under crashes", () => {
  let open: OpenDb;
  let db: Db;
  beforeAll(async () => {
    open = await backend!.open();
    db = open.db;
    await prepare(db);
  });
  afterAll(() => open?.close());

  it.each([
    { name: "RabbitMQ", make: rabbitTransport, seed: 11 },
    { name: "NATS JetStream", make: natsTransport, seed: 23 },
  ])(
    "applies each of 10,000 events exactly once through $name with relays killed and consumers crashing before their ack",
    async ({ make, seed }) => {
      const transport = await make();
      const rng = createRng(seed);
      const consumerName = unique("chaos");
      let relayKills = 0;
      let crashPoints = 0;
      let consumerCrashes = 0;
      let running = true;
      const relays = new Set<Relay>();
      const consumers = new Set<RunningConsumer>();
      // Each relay and consumer has a watcher that restarts it after a crash. The watchers are awaited
      // before the queue is deleted, so no restart outlives the run; a restart that fails is a failure.
      const watchers = new Set<Promise<void>>();
      const restartFailures: unknown[] = [];
      const track = (watcher: Promise<void>) => {
        const settled = watcher
          .catch((err: unknown) => {
            restartFailures.push(err);
          })
          .finally(() => watchers.delete(settled));
        watchers.add(settled);
      };
      const stopAll = async () => {
        running = false;
        // A watcher may be starting a replacement meanwhile: that one stops itself once started (it sees
        // `running` false), and the loop waits for its watcher too.
        while (relays.size + consumers.size + watchers.size > 0) {
          await Promise.all([...relays].map((r) => r.stop().catch(() => {})));
          await Promise.all([...consumers].map((c) => c.stop().catch(() => {})));
          await Promise.all([...watchers]);
        }
      };
      const totals = { duplicates: 0, published: 0 };

      const startRelay = async (): Promise<void> => {
        const publisher = transport.publisher();
        const relay = new Relay({
          db,
          publisher,
          topics: [transport.topic],
          batchSize: 200,
          leaseMs: 500,
          pollMs: 20,
          // Each batch: 3% die after the claim, 3% after the publish (the copies are what the inbox absorbs).
          // The 3rd and 8th crash points always fire, so a fast run with few, large batches still has kills.
          crash: () =>
            relayKills < 40 &&
            (++crashPoints === 3 || crashPoints === 8 || rng.next() < 0.03) &&
            ++relayKills > 0,
        });
        relays.add(relay);
        await relay.start();
        if (!running) await relay.stop(); // started while the run was being stopped
        track(
          (async () => {
            await until(() => !relay.running, 120_000, "relay death").catch(() => {});
            relays.delete(relay);
            totals.published += relay.stats.published;
            await relay.stop();
            await publisher.close();
            if (running) await startRelay();
          })(),
        );
      };
      const startConsumer = async (): Promise<void> => {
        const consumer = await transport.consume({
          inbox: new Inbox(db, { consumer: consumerName }),
          handler: record,
          prefetch: 200,
          // About one applied message in 800 takes its consumer down right after the commit.
          crash: () => consumerCrashes < 15 && rng.next() < 1 / 800 && ++consumerCrashes > 0,
        });
        consumers.add(consumer);
        if (!running) await consumer.stop(); // started while the run was being stopped
        track(
          consumer.closed.then(async () => {
            consumers.delete(consumer);
            totals.duplicates += consumer.stats.duplicates;
            await new Promise((r) => setTimeout(r, 50));
            // Checked after the pause: the run may have ended (and the queue been deleted) meanwhile.
            if (running) await startConsumer();
          }),
        );
      };

      try {
        await Promise.all([startRelay(), startRelay(), startConsumer(), startConsumer()]);
        const ids = await produce(db, transport.topic, EVENTS);
        const progress = async () => {
          const { rows } = await db.query<{ pending: string; applied: string }>(
            `SELECT (SELECT count(*) FROM idem.outbox WHERE topic = $1 AND published_at IS NULL) AS pending,
                    (SELECT count(*) FROM idem.inbox WHERE consumer = $2 AND status <> 'marker') AS applied`,
            [transport.topic, consumerName],
          );
          return { pending: Number(rows[0]!.pending), applied: Number(rows[0]!.applied) };
        };
        let last = { pending: -1, applied: -1 };
        await until(
          async () => {
            last = await progress();
            return last.pending === 0 && last.applied === EVENTS;
          },
          45_000,
          "every event published and applied",
        ).catch((err: Error) => {
          const state = `${relays.size} relays, ${consumers.size} consumers, ${relayKills} relay kills, ${consumerCrashes} consumer crashes`;
          throw new Error(`${err.message}: ${last.pending} unpublished, ${last.applied} applied; ${state}`);
        });
        await stopAll();
        expect(restartFailures).toEqual([]);

        const { rows } = await db.query<{ distinct: string; total: string; strays: string }>(
          `SELECT count(DISTINCT e.message_id) AS distinct, count(*) AS total,
                  count(*) FILTER (WHERE o.id IS NULL) AS strays
           FROM effects e JOIN idem.inbox i ON i.message_id = e.message_id AND i.consumer = $1 AND i.status <> 'marker'
           LEFT JOIN idem.outbox o ON o.id::text = e.message_id`,
          [consumerName],
        );
        const r = rows[0]!;
        expect(Number(r.distinct)).toBe(EVENTS); // none lost
        expect(Number(r.total)).toBe(EVENTS); // none applied twice
        expect(Number(r.strays)).toBe(0);
        expect(ids).toHaveLength(EVENTS);
        expect(relayKills).toBeGreaterThan(0);
        expect(consumerCrashes).toBeGreaterThan(0);
        console.log(
          `${transport.topic}: ${relayKills} relay kills, ${consumerCrashes} consumer crashes after commit, ${totals.duplicates} duplicate deliveries absorbed`,
        );
      } finally {
        await stopAll();
        await transport.cleanup();
      }
    },
    90_000,
  );
});
