/**
 * SQS under its faults, on an SQS-compatible server (ElasticMQ): work that outlasts the visibility
 * timeout, without and with the heartbeat; a consumer killed with SIGKILL mid-batch; a FIFO group
 * held by a failing message. After each: every event applied exactly once, none lost.
 */
import { CreateQueueCommand, DeleteQueueCommand, SQSClient } from "@aws-sdk/client-sqs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Inbox } from "../../src/messaging/inbox.ts";
import { parkedMessages } from "../../src/messaging/inbox-admin.ts";
import { Relay } from "../../src/messaging/relay.ts";
import { consumeSqs, SqsPublisher } from "../../src/messaging/sqs.ts";
import type { Db } from "../../src/postgres/db.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { type OpenDb, serverBackends } from "../helpers/db.ts";
import { NO_SQS, sayWhySkipped, sqsClientConfig } from "./brokers.ts";
import { appliedCount, faultEffect, faultResult, prepareFaultEffects, startWorker } from "./fault-effects.ts";
import { prepare, unique, until } from "./helpers.ts";
import { writeBacklog } from "./ordered.ts";

sayWhySkipped(NO_SQS);

const backend = serverBackends.find((b) => b.name === "pg");

describe.skipIf(NO_SQS !== undefined || !backend)(
  "SQS under faults",
  () => {
    let open: OpenDb;
    let db: Db;
    let sqs: SQSClient;
    const queues: string[] = [];
    beforeAll(async () => {
      sqs = new SQSClient(sqsClientConfig());
    });
    afterAll(async () => {
      for (const q of queues) await sqs.send(new DeleteQueueCommand({ QueueUrl: q })).catch(() => {});
      sqs?.destroy();
    });
    async function scenario(fifo = false) {
      open = await backend!.open();
      db = open.db;
      await prepare(db);
      await prepareFaultEffects(db);
      const name = `${unique("idem_fault")}${fifo ? ".fifo" : ""}`;
      const out = await sqs.send(
        new CreateQueueCommand({ QueueName: name, Attributes: fifo ? { FifoQueue: "true" } : {} }),
      );
      queues.push(out.QueueUrl!);
      return name;
    }
    async function publish(queue: string): Promise<void> {
      const publisher = new SqsPublisher({ clientConfig: sqsClientConfig() });
      const relay = new Relay({ db, publisher, topics: [queue], orderByAggregate: true, batchSize: 1_000 });
      while ((await relay.runOnce()) > 0) {}
      await publisher.close();
    }
    /** One event whose effect takes `workMs` in its transaction, consumed by two consumers at once. */
    async function slowWork(heartbeat: boolean) {
      const queue = await scenario();
      await writeBacklog(db, queue, 1, 1);
      await publish(queue);
      const consumers = await Promise.all(
        ["first", "second"].map((member) =>
          consumeSqs({
            clientConfig: sqsClientConfig(),
            queue,
            visibilityTimeoutSec: 1,
            heartbeat,
            waitTimeSec: 1,
            inbox: new Inbox(db, { consumer: queue }),
            batchHandler: async (tx, ms) => {
              await tx.query("SELECT pg_sleep(3.5)"); // 3.5 visibility timeouts
              await faultEffect(member)(tx, ms);
            },
          }),
        ),
      );
      try {
        await until(async () => (await appliedCount(db)) === 1, 20_000, "the effect");
        // Long enough for a copy to reappear and be received, were it to.
        await new Promise((r) => setTimeout(r, 2_500));
      } finally {
        await Promise.all(consumers.map((c) => c.stop()));
      }
      return consumers.map((c) => c.stats);
    }

    it("work longer than the visibility timeout, no heartbeat: the copy's consumer waits and gets 'duplicate', one effect", async () => {
      const [a, b] = await slowWork(false);
      expect(a!.applied + b!.applied).toBe(1);
      expect(a!.duplicates + b!.duplicates).toBeGreaterThanOrEqual(1);
      expect(await faultResult(db)).toMatchObject({ total: 1, distinct: 1 });
      await open.close();
    });

    it("work longer than the visibility timeout, with the heartbeat: the message never reappears", async () => {
      const [a, b] = await slowWork(true);
      expect(a!.applied + b!.applied).toBe(1);
      expect(a!.duplicates + b!.duplicates).toBe(0);
      expect(await faultResult(db)).toMatchObject({ total: 1, distinct: 1 });
      await open.close();
    });

    it("a consumer killed with SIGKILL mid-batch: its messages reappear and another applies them, each once", async () => {
      const queue = await scenario();
      const n = 1_500;
      await writeBacklog(db, queue, n, 50);
      await publish(queue);
      const a = await startWorker("sqs", open.url!, queue, "a");
      try {
        await until(async () => (await appliedCount(db)) >= 400, 60_000, "400 applied by a");
        a.kill();
        await a.exited;
        const b = await startWorker("sqs", open.url!, queue, "b");
        await until(async () => (await faultResult(db)).distinct >= n, 90_000, `${n} applied`);
        await new Promise((r) => setTimeout(r, 3_000)); // a late copy would show now (visibility 2 s)
        await b.stop();
      } finally {
        a.kill();
      }
      expect(await faultResult(db)).toMatchObject({ total: n, distinct: n, members: 2 });
      await open.close();
    });

    it("a FIFO group held by a failing message: the other groups go on; the group resumes in order once it is parked", async () => {
      const queue = await scenario(true);
      await db.transaction(async (tx) => {
        const event = (agg: string, seq: number, type = "step") =>
          writeOutbox(tx, {
            topic: queue,
            type,
            payload: { agg, seq },
            aggregateType: "g",
            aggregateId: agg,
          });
        await event("held", 0, "bad");
        for (let seq = 1; seq <= 3; seq++) await event("held", seq);
        for (let g = 0; g < 5; g++) for (let seq = 0; seq < 4; seq++) await event(`free${g}`, seq);
      });
      await publish(queue);
      const consumer = await consumeSqs({
        clientConfig: sqsClientConfig(),
        queue,
        waitTimeSec: 1,
        retryDelayMs: 1_000, // the other groups finish well within the held one's 3 s of retries
        inbox: new Inbox(db, { consumer: queue, maxAttempts: 4 }),
        handler: async (tx, m) => {
          if (m.type === "bad") throw new Error("cannot render receipt");
          await faultEffect("c")(tx, [m]);
        },
      });
      try {
        await until(async () => (await appliedCount(db)) === 23, 30_000, "23 effects");
      } finally {
        await consumer.stop();
      }
      expect(consumer.stats.parked).toBe(1);
      expect(await faultResult(db)).toEqual({ total: 23, distinct: 23, outOfOrder: 0, members: 1 });
      // Every other group finished before the held one's next message went through.
      const { rows } = await db.query<{ agg: string }>("SELECT agg FROM fault_effects ORDER BY n");
      expect(rows.findIndex((r) => r.agg === "held")).toBe(20);
      expect((await parkedMessages(db, { consumer: queue }))[0]).toMatchObject({ type: "bad", attempts: 4 });
      await open.close();
    });
  },
  300_000,
);
