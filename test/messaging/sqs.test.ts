/**
 * Amazon SQS end to end on an SQS-compatible server (ElasticMQ, started by .ci/run through
 * scripts/elasticmq.sh): outbox -> relay -> queue (standard and FIFO) -> consumer -> inbox. Visibility
 * timeouts, killed consumers and blocked FIFO groups are in sqs-faults.slow.test.ts.
 */
import {
  CreateQueueCommand,
  DeleteQueueCommand,
  GetQueueAttributesCommand,
  ReceiveMessageCommand,
  SendMessageCommand,
  SQSClient,
} from "@aws-sdk/client-sqs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Inbox } from "../../src/messaging/inbox.ts";
import { parkedMessages } from "../../src/messaging/inbox-admin.ts";
import { Relay } from "../../src/messaging/relay.ts";
import { consumeSqs, SqsPublisher } from "../../src/messaging/sqs.ts";
import type { Db } from "../../src/postgres/db.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { type OpenDb, serverBackends } from "../helpers/db.ts";
import { NO_SQS, sayWhySkipped, sqsClientConfig } from "./brokers.ts";
import { effectCounts, prepare, record, unique, until, writeCredits } from "./helpers.ts";
import { orderedEffect, orderedResult, prepareOrdered, writeBacklog } from "./ordered.ts";

sayWhySkipped(NO_SQS);

const backend = serverBackends.find((b) => b.name === "pg");

describe.skipIf(NO_SQS !== undefined || !backend)("SQS", () => {
  let open: OpenDb;
  let db: Db;
  let sqs: SQSClient;
  const queues: string[] = [];
  beforeAll(async () => {
    open = await backend!.open();
    db = open.db;
    await prepare(db);
    await prepareOrdered(db);
    sqs = new SQSClient(sqsClientConfig());
  });
  afterAll(async () => {
    for (const q of queues) await sqs.send(new DeleteQueueCommand({ QueueUrl: q })).catch(() => {});
    sqs?.destroy();
    await open?.close();
  });
  async function newQueue(
    options: { fifo?: boolean; attributes?: Record<string, string> } = {},
  ): Promise<{ name: string; url: string }> {
    const name = `${unique("idem_test")}${options.fifo ? ".fifo" : ""}`;
    const out = await sqs.send(
      new CreateQueueCommand({
        QueueName: name,
        Attributes: { ...(options.fifo ? { FifoQueue: "true" } : {}), ...options.attributes },
      }),
    );
    queues.push(out.QueueUrl!);
    return { name, url: out.QueueUrl! };
  }
  const publisher = () => new SqsPublisher({ clientConfig: sqsClientConfig() });
  const consume = (queue: string, o: Partial<Parameters<typeof consumeSqs>[0]> = {}) =>
    consumeSqs({
      clientConfig: sqsClientConfig(),
      queue,
      waitTimeSec: 1,
      inbox: new Inbox(db, { consumer: queue }),
      handler: record,
      ...o,
    });
  async function visible(url: string): Promise<number> {
    const out = await sqs.send(
      new GetQueueAttributesCommand({
        QueueUrl: url,
        AttributeNames: ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
      }),
    );
    return (
      Number(out.Attributes!.ApproximateNumberOfMessages) +
      Number(out.Attributes!.ApproximateNumberOfMessagesNotVisible)
    );
  }

  it("delivers 1,000 events through a standard queue, each applied once, and deletes them after the commit", async () => {
    const { name, url } = await newQueue();
    const ids = await writeCredits(db, 1_000, name);
    const pub = publisher();
    const relay = new Relay({ db, publisher: pub, topics: [name], pollMs: 20 });
    const consumer = await consume(name);
    await relay.start();
    try {
      await until(() => consumer.stats.applied >= 1_000, 30_000, "1,000 effects");
    } finally {
      await relay.stop();
      await consumer.stop();
      await pub.close();
    }
    expect(relay.stats.published).toBe(1_000);
    const { rows } = await db.query<{ message_id: string }>(
      "SELECT message_id FROM effects WHERE message_id = ANY($1::text[])",
      [ids],
    );
    expect(rows).toHaveLength(1_000);
    expect(new Set(rows.map((r) => r.message_id)).size).toBe(1_000);
    await until(async () => (await visible(url)) === 0, 5_000, "the queue emptied by the deletes");
  });

  it("keeps each aggregate's order through a FIFO queue (group = aggregate) and drops a republished copy", async () => {
    const { name } = await newQueue({ fifo: true });
    await writeBacklog(db, name, 600, 12);
    const pub = publisher();
    const relay = new Relay({ db, publisher: pub, topics: [name], orderByAggregate: true, pollMs: 20 });
    await relay.start();
    await until(() => relay.stats.published >= 600, 30_000, "600 published");
    await relay.stop();
    // As if the relay had died before marking: the FIFO queue drops the copies (same deduplication id).
    await db.query("UPDATE idem.outbox SET published_at = NULL WHERE topic = $1", [name]);
    await new Relay({ db, publisher: pub, topics: [name], batchSize: 1_000 }).runOnce();
    await pub.close();
    const consumer = await consume(name, {
      handler: undefined,
      batchHandler: orderedEffect(name),
      concurrency: 4,
      prefetch: 100,
    });
    try {
      await until(() => consumer.stats.applied >= 600, 30_000, "600 effects");
    } finally {
      await consumer.stop();
    }
    expect(await orderedResult(db, name)).toEqual({ total: 600, distinct: 600, outOfOrder: 0 });
    expect(consumer.stats.duplicates).toBe(0);
  });

  it("respects a redrive policy: a failing message moves to the dead-letter queue after maxReceiveCount", async () => {
    const dlq = await newQueue();
    const arn = (
      await sqs.send(new GetQueueAttributesCommand({ QueueUrl: dlq.url, AttributeNames: ["QueueArn"] }))
    ).Attributes!.QueueArn!;
    const { name } = await newQueue({
      attributes: { RedrivePolicy: JSON.stringify({ deadLetterTargetArn: arn, maxReceiveCount: 2 }) },
    });
    await db.transaction((tx) => writeOutbox(tx, { topic: name, type: "bad", payload: { cents: 1 } }));
    const pub = publisher();
    await new Relay({ db, publisher: pub, topics: [name] }).runOnce();
    await pub.close();
    const consumer = await consume(name, {
      retryDelayMs: 1,
      inbox: new Inbox(db, { consumer: name, maxAttempts: 10 }),
      handler: async () => {
        throw new Error("cannot render receipt");
      },
    });
    try {
      await until(async () => (await visible(dlq.url)) === 1, 20_000, "the message in the dead-letter queue");
    } finally {
      await consumer.stop();
    }
    expect(consumer.stats.retried).toBe(2);
    expect(consumer.stats.parked).toBe(0);
  });

  it("takes partial batch failures message by message: parks the poison (visible to idem/admin), refuses a message without idem-id", async () => {
    const { name, url } = await newQueue();
    const before = (await effectCounts(db)).total;
    await db.transaction(async (tx) => {
      for (let i = 0; i < 9; i++) await writeOutbox(tx, { topic: name, type: "ok", payload: { cents: 1 } });
      await writeOutbox(tx, { topic: name, type: "bad", payload: { cents: 1 } });
    });
    const pub = publisher();
    await new Relay({ db, publisher: pub, topics: [name] }).runOnce();
    await pub.close();
    await sqs.send(new SendMessageCommand({ QueueUrl: url, MessageBody: "{}" })); // no idem-id
    const consumer = await consume(name, {
      retryDelayMs: 1,
      inbox: new Inbox(db, { consumer: name, maxAttempts: 2 }),
      handler: async (tx, m) => {
        if (m.type === "bad") throw new Error("cannot render receipt");
        await record(tx, m);
      },
    });
    try {
      await until(
        () => consumer.stats.parked === 1 && consumer.stats.applied === 9 && consumer.stats.refused >= 1,
        20_000,
        "9 applied, 1 parked, 1 refused",
      );
    } finally {
      await consumer.stop();
    }
    expect((await effectCounts(db)).total - before).toBe(9);
    const parked = await parkedMessages(db, { consumer: name });
    expect(parked).toHaveLength(1);
    expect(parked[0]).toMatchObject({
      topic: name,
      type: "bad",
      attempts: 2,
      lastError: "cannot render receipt",
    });
    // The poison was deleted once parked; the message without an id is left to reappear.
    await until(async () => (await visible(url)) === 1, 5_000, "only the refused message left");
    const left = await sqs.send(new ReceiveMessageCommand({ QueueUrl: url, WaitTimeSeconds: 0 }));
    expect(left.Messages?.[0]?.Body ?? "{}").toBe("{}");
  });
});
