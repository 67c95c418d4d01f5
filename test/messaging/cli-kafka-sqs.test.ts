/** `idem relay` to Kafka and SQS, by flag and by environment variable, as the dispatcher calls it. */

import {
  CreateQueueCommand,
  DeleteQueueCommand,
  GetQueueAttributesCommand,
  SQSClient,
} from "@aws-sdk/client-sqs";
import { Admin } from "@platformatic/kafka";
import { afterEach, describe, expect, it, vi } from "vitest";
import { relayCommand } from "../../src/cli/relay.ts";
import { CliError } from "../../src/cli/shared.ts";
import { Inbox } from "../../src/messaging/inbox.ts";
import { consumeKafka } from "../../src/messaging/kafka.ts";
import { serverBackends } from "../helpers/db.ts";
import { KAFKA, NO_KAFKA, NO_SQS, SQS, sayWhySkipped, sqsClientConfig } from "./brokers.ts";
import { prepare, record, unique, until, writeCredits } from "./helpers.ts";

sayWhySkipped(NO_KAFKA ?? NO_SQS);

const backend = serverBackends.find((b) => b.name === "pg");
const saved = { ...process.env };
afterEach(() => {
  for (const k of [
    "KAFKA_URL",
    "SQS_URL",
    "AMQP_URL",
    "NATS_URL",
    "WEBHOOK_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_REGION",
  ]) {
    if (saved[k] === undefined) delete process.env[k];
    else process.env[k] = saved[k];
  }
  vi.restoreAllMocks();
});

describe("idem relay to Kafka and SQS", () => {
  it("refuses --pipeline to SQS and two brokers at once, with exit 2", async () => {
    for (const argv of [
      ["--sqs", "http://x", "--ordered", "--pipeline"],
      ["--kafka", "kafka://x:1", "--sqs", "http://y"],
    ]) {
      const err = await relayCommand(argv).catch((e) => e);
      expect(err).toBeInstanceOf(CliError);
      expect(err.exitCode).toBe(2);
    }
  });

  it.skipIf(NO_KAFKA !== undefined || !backend)(
    "--once publishes what is pending to Kafka (from KAFKA_URL), keyed by aggregate, and a consumer group applies each once",
    async () => {
      const { db, url, close } = await backend!.open();
      const topic = unique("idem_cli");
      const admin = new Admin({ clientId: "idem-test", bootstrapBrokers: KAFKA!.split(",") });
      try {
        await prepare(db);
        await admin.createTopics({ topics: [topic], partitions: 3, replicas: 1 });
        await writeCredits(db, 120, topic);
        process.env.KAFKA_URL = `kafka://${KAFKA}`;
        const log = vi.spyOn(console, "log").mockImplementation(() => {});
        expect(await relayCommand(["--database-url", url!, "--once", "--ordered", "--pipeline"])).toBe(0);
        expect(String(log.mock.calls.at(-1)![0])).toMatch(/^published 120 event\(s\) to Kafka 127\.0\.0\.1/);
        const consumer = await consumeKafka({
          brokers: KAFKA!,
          topics: topic,
          groupId: topic,
          inbox: new Inbox(db, { consumer: topic }),
          handler: record,
        });
        try {
          await until(() => consumer.stats.applied >= 120, 20_000, "120 effects");
        } finally {
          await consumer.stop();
        }
        expect(consumer.stats).toMatchObject({ applied: 120, duplicates: 0 });
      } finally {
        await admin.deleteTopics({ topics: [topic] }).catch(() => {});
        await admin.close();
        await close();
      }
    },
  );

  it.skipIf(NO_SQS !== undefined || !backend)(
    "--once publishes what is pending to SQS (--sqs endpoint, queue named by the topic)",
    async () => {
      const { db, url, close } = await backend!.open();
      const sqs = new SQSClient(sqsClientConfig());
      const queue = unique("idem_cli");
      const { QueueUrl } = await sqs.send(new CreateQueueCommand({ QueueName: queue }));
      try {
        await prepare(db);
        await writeCredits(db, 35, queue);
        Object.assign(process.env, {
          AWS_ACCESS_KEY_ID: "idem",
          AWS_SECRET_ACCESS_KEY: "idem",
          AWS_REGION: "us-east-1",
        });
        const log = vi.spyOn(console, "log").mockImplementation(() => {});
        expect(await relayCommand(["--database-url", url!, "--once", "--sqs", SQS!])).toBe(0);
        expect(String(log.mock.calls.at(-1)![0])).toMatch(/^published 35 event\(s\) to SQS/);
        const attrs = await sqs.send(
          new GetQueueAttributesCommand({ QueueUrl, AttributeNames: ["ApproximateNumberOfMessages"] }),
        );
        expect(Number(attrs.Attributes!.ApproximateNumberOfMessages)).toBe(35);
      } finally {
        await sqs.send(new DeleteQueueCommand({ QueueUrl })).catch(() => {});
        sqs.destroy();
        await close();
      }
    },
  );

  it.skipIf(NO_KAFKA !== undefined || !backend)(
    "--once exits 1 with the fix when Kafka cannot be reached",
    async () => {
      const { db, url, close } = await backend!.open();
      try {
        await prepare(db);
        await writeCredits(db, 1, "q");
        const err = await relayCommand(["--database-url", url!, "--once", "--kafka", "127.0.0.1:1"]).catch(
          (e) => e,
        );
        expect(err).toBeInstanceOf(CliError);
        expect(err.exitCode).toBe(1);
        expect(err.message).toMatch(/cannot reach Kafka 127\.0\.0\.1:1: start the broker or fix its URL/);
      } finally {
        await close();
      }
    },
  );
});
