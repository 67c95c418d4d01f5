/**
 * Kafka under its faults, on real brokers: a consumer killed with SIGKILL mid-batch, members joining
 * and leaving under load, the partition leader's broker killed in a three-broker cluster, a relay
 * dying between produce and mark. After each: every event applied exactly once, in order per
 * aggregate, none lost. (Slow tier: a minute or two in all.)
 */
import { Admin } from "@platformatic/kafka";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningConsumer } from "../../src/messaging/consumer.ts";
import { Inbox } from "../../src/messaging/inbox.ts";
import { consumeKafka, KafkaPublisher } from "../../src/messaging/kafka.ts";
import { Relay } from "../../src/messaging/relay.ts";
import { type OpenDb, serverBackends } from "../helpers/db.ts";
import { KAFKA, type KafkaCluster, NO_KAFKA, sayWhySkipped, startKafkaCluster } from "./brokers.ts";
import { appliedCount, faultEffect, faultResult, prepareFaultEffects, startWorker } from "./fault-effects.ts";
import { prepare, unique, until } from "./helpers.ts";
import { writeBacklog } from "./ordered.ts";

sayWhySkipped(NO_KAFKA);

const backend = serverBackends.find((b) => b.name === "pg");

describe.skipIf(NO_KAFKA !== undefined || !backend)(
  "Kafka under faults",
  () => {
    let open: OpenDb;
    let admin: Admin;
    beforeAll(async () => {
      admin = new Admin({ clientId: "idem-test", bootstrapBrokers: KAFKA!.split(",") });
    });
    afterAll(async () => {
      await admin?.close();
    });
    /** A fresh database (the effects of one scenario) and a topic of its own. */
    async function scenario(partitions = 6) {
      open = await backend!.open();
      await prepare(open.db);
      await prepareFaultEffects(open.db);
      const topic = unique("idem_fault");
      await admin.createTopics({ topics: [topic], partitions, replicas: 1 });
      return {
        db: open.db,
        url: open.url!,
        topic,
        async done() {
          await admin.deleteTopics({ topics: [topic] }).catch(() => {});
          await open.close();
        },
      };
    }

    it("a consumer killed with SIGKILL mid-batch: the next member replays from the committed offsets, nothing twice", async () => {
      const s = await scenario();
      const n = 6_000;
      await writeBacklog(s.db, s.topic, n, 60);
      const publisher = new KafkaPublisher({ brokers: KAFKA! });
      const relay = new Relay({
        db: s.db,
        publisher,
        topics: [s.topic],
        orderByAggregate: true,
        pipeline: true,
      });
      await relay.start();
      const a = await startWorker("kafka", s.url, s.topic, "a");
      try {
        await until(async () => (await appliedCount(s.db)) >= 1_500, 60_000, "1,500 applied by a");
        a.kill();
        await a.exited;
        const b = await startWorker("kafka", s.url, s.topic, "b");
        await until(async () => (await faultResult(s.db)).distinct >= n, 90_000, `${n} applied`);
        await b.stop();
      } finally {
        a.kill();
        await relay.stop();
        await publisher.close();
      }
      expect(await faultResult(s.db)).toEqual({ total: n, distinct: n, outOfOrder: 0, members: 2 });
      await s.done();
    });

    it("members joining and leaving under load: each event once, in order, and a partition's work stops with its revocation", async () => {
      const s = await scenario();
      const n = 8_000;
      await writeBacklog(s.db, s.topic, n, 80);
      const publisher = new KafkaPublisher({ brokers: KAFKA! });
      const relay = new Relay({
        db: s.db,
        publisher,
        topics: [s.topic],
        orderByAggregate: true,
        pipeline: true,
      });
      const members = new Map<string, RunningConsumer>();
      const join = async (name: string) =>
        members.set(
          name,
          await consumeKafka({
            brokers: KAFKA!,
            topics: s.topic,
            groupId: s.topic,
            inbox: new Inbox(s.db, { consumer: s.topic }),
            // A slower effect, so that rebalances land in the middle of batches.
            batchHandler: async (tx, ms) => {
              await tx.query("SELECT pg_sleep(0.02)");
              await faultEffect(name)(tx, ms);
            },
            batchSize: 40,
            prefetch: 300,
          }),
        );
      const leave = async (name: string) => {
        await members.get(name)!.stop();
        members.delete(name);
      };
      await relay.start();
      try {
        await join("m1");
        const steps: [number, () => Promise<unknown>][] = [
          [1_000, () => join("m2")],
          [2_000, () => join("m3")],
          [3_000, () => leave("m1")],
          [4_500, () => join("m4")],
          [5_500, () => leave("m2")],
          [6_500, () => leave("m3")],
        ];
        for (const [at, step] of steps) {
          await until(async () => (await appliedCount(s.db)) >= at, 60_000, `${at} applied`);
          await step();
        }
        await until(async () => (await faultResult(s.db)).distinct >= n, 90_000, `${n} applied`);
      } finally {
        for (const name of [...members.keys()]) await leave(name);
        await relay.stop();
        await publisher.close();
      }
      const result = await faultResult(s.db);
      expect(result).toMatchObject({ total: n, distinct: n, outOfOrder: 0 });
      // (How many of the four got records before the backlog ran out depends on the machine's pace.)
      expect(result.members).toBeGreaterThanOrEqual(2);
      // A member's effects on a partition never interleave with another's: each partition changes
      // hands at most once per membership change (6), not back and forth while two work on it.
      const { rows } = await s.db.query<{ part: string; switches: string }>(
        `SELECT part, count(*) FILTER (WHERE member <> prev) AS switches
       FROM (SELECT part, member, lag(member) OVER (PARTITION BY part ORDER BY at, n) AS prev FROM fault_effects) t
       GROUP BY part`,
      );
      expect(rows).toHaveLength(6);
      for (const r of rows) expect(Number(r.switches)).toBeLessThanOrEqual(6);
      await s.done();
    });

    it("a member that loses partitions finishes its transactions before rejoining: none of its effects on them commits after the new owner has them", async () => {
      const s = await scenario();
      const n = 1_200;
      await writeBacklog(s.db, s.topic, n, 60);
      const publisher = new KafkaPublisher({ brokers: KAFKA! });
      await new Relay({ db: s.db, publisher, topics: [s.topic], batchSize: 2_000 }).runOnce();
      await publisher.close();
      // The first member's transactions under way when the second joins take 2.5 s (the effect logged at
      // their end, just before the commit); the second's first effect comes well within that. Without
      // the drain before rejoining, the first would commit on partitions already handed over.
      let joined = false;
      let assigned: Date | undefined;
      const member = (name: string) =>
        consumeKafka({
          brokers: KAFKA!,
          topics: s.topic,
          groupId: s.topic,
          inbox: new Inbox(s.db, { consumer: s.topic }),
          batchHandler: async (tx, ms) => {
            if (name === "first" && !joined) await tx.query("SELECT pg_sleep(2.5)");
            await faultEffect(name)(tx, ms);
          },
          batchSize: 20,
          concurrency: 4,
        });
      const first = await member("first");
      let second: RunningConsumer | undefined;
      try {
        await until(async () => (await appliedCount(s.db)) >= 80, 30_000, "80 applied by the first");
        second = await member("second"); // a rebalance while the first has transactions under way
        joined = true;
        // The second member has its partitions now: the first acknowledged their revocation before.
        assigned = (await s.db.query<{ t: Date }>("SELECT clock_timestamp() AS t")).rows[0]!.t;
        await until(async () => (await faultResult(s.db)).distinct >= n, 90_000, `${n} applied`);
      } finally {
        await second?.stop();
        await first.stop();
      }
      expect(await faultResult(s.db)).toEqual({ total: n, distinct: n, outOfOrder: 0, members: 2 });
      // No effect of the first member on a partition it lost commits after the second got it.
      const late = await s.db.query<{ part: string; n: string }>(
        `SELECT part, count(*) AS n FROM fault_effects
         WHERE member = 'first' AND at > $1
           AND part IN (SELECT part FROM fault_effects WHERE member = 'second') GROUP BY part`,
        [assigned],
      );
      const moved = await s.db.query<{ n: string }>(
        "SELECT count(DISTINCT part) AS n FROM fault_effects WHERE member = 'second'",
      );
      expect(Number(moved.rows[0]!.n)).toBeGreaterThan(0); // the second member did take partitions
      expect(late.rows).toEqual([]);
      await s.done();
    });

    it("a relay dying between produce and mark: the next one publishes again, the inbox absorbs every copy", async () => {
      const s = await scenario(3);
      const n = 2_000;
      await writeBacklog(s.db, s.topic, n, 20);
      const publisher = new KafkaPublisher({ brokers: KAFKA! });
      let batches = 0;
      const dying = new Relay({
        db: s.db,
        publisher,
        topics: [s.topic],
        orderByAggregate: true,
        pipeline: true,
        leaseMs: 1_000,
        crash: (point) => point === "after-publish" && ++batches === 2,
      });
      await dying.start();
      await until(() => !dying.running, 20_000, "the relay to die after its second publish");
      await dying.stop();
      const relay = new Relay({
        db: s.db,
        publisher,
        topics: [s.topic],
        orderByAggregate: true,
        pipeline: true,
      });
      const consumer = await consumeKafka({
        brokers: KAFKA!,
        topics: s.topic,
        groupId: s.topic,
        inbox: new Inbox(s.db, { consumer: s.topic }),
        batchHandler: faultEffect("c"),
      });
      await relay.start();
      try {
        await until(async () => (await faultResult(s.db)).distinct >= n, 60_000, `${n} applied`);
        await until(() => consumer.stats.applied + consumer.stats.duplicates > n, 10_000, "the copies read");
      } finally {
        await relay.stop();
        await consumer.stop();
        await publisher.close();
      }
      expect(consumer.stats.duplicates).toBeGreaterThan(0); // the unmarked batch went out twice
      expect(await faultResult(s.db)).toEqual({ total: n, distinct: n, outOfOrder: 0, members: 1 });
      await s.done();
    });

    describe("a three-broker cluster (replication factor 3, min.insync.replicas=2)", () => {
      let cluster: KafkaCluster;
      beforeAll(async () => {
        cluster = await startKafkaCluster();
      }, 180_000);
      afterAll(async () => {
        await cluster?.stop();
      });

      it("the partition leader's broker killed with SIGKILL mid-run: every event once, in order, none lost", async () => {
        open = await backend!.open();
        const db = open.db;
        await prepare(db);
        await prepareFaultEffects(db);
        const topic = unique("idem_fault");
        const cadmin = new Admin({ clientId: "idem-test", bootstrapBrokers: cluster.brokers.split(",") });
        await cadmin.createTopics({ topics: [topic], partitions: 6, replicas: 3 });
        const n = 6_000;
        await writeBacklog(db, topic, n, 60);
        const publisher = new KafkaPublisher({ brokers: cluster.brokers, timeoutMs: 5_000 });
        const relay = new Relay({ db, publisher, topics: [topic], orderByAggregate: true, pipeline: true });
        const errors: string[] = [];
        const consumer = await consumeKafka({
          brokers: cluster.brokers,
          topics: topic,
          groupId: topic,
          inbox: new Inbox(db, { consumer: topic }),
          batchHandler: faultEffect("c"),
          onError: (e) => errors.push(e.message),
        });
        let killed = 0;
        await relay.start();
        try {
          await until(async () => (await appliedCount(db)) >= 1_500, 60_000, "1,500 applied");
          const meta = await cadmin.metadata({ topics: [topic] });
          killed = meta.topics.get(topic)!.partitions[0]!.leader;
          await cluster.kill(killed);
          await until(
            async () => (await appliedCount(db)) >= 4_000,
            90_000,
            "4,000 applied with a broker down",
          );
          await cluster.start(killed);
          await until(async () => (await faultResult(db)).distinct >= n, 90_000, `${n} applied`);
        } finally {
          await relay.stop();
          await consumer.stop();
          await publisher.close();
          await cadmin.close();
        }
        console.log(
          `leader broker ${killed} killed: relay put back ${relay.stats.unavailable} batch(es); consumer duplicates ${consumer.stats.duplicates}; ${errors.length} errors reported`,
        );
        expect(killed).toBeGreaterThan(0);
        expect(await faultResult(db)).toEqual({ total: n, distinct: n, outOfOrder: 0, members: 1 });
        await open.close();
      }, 300_000);
    });
  },
  600_000,
);
