/**
 * Kafka and SQS for the messaging benchmark (bench/messaging.ts), beside RabbitMQ and NATS.
 *
 * KAFKA_URL (bootstrap brokers) and SQS_URL (an SQS endpoint) point at running ones; without them the
 * benchmark starts its own through scripts/kafka.sh (one KRaft broker) and scripts/elasticmq.sh
 * (ElasticMQ) on BENCH_KAFKA_PORT (default 25100) and BENCH_SQS_PORT (default 25120), and stops them
 * at the end. Kafka topics have 6 partitions; SQS queues are standard, FIFO for the ordered drains.
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  CreateQueueCommand,
  DeleteQueueCommand,
  PurgeQueueCommand,
  SQSClient,
  type SQSClientConfig,
} from "@aws-sdk/client-sqs";
import { Admin } from "@platformatic/kafka";
import { Inbox } from "../src/messaging/inbox.ts";
import { consumeKafka, KafkaPublisher } from "../src/messaging/kafka.ts";
import { consumeSqs, SqsPublisher } from "../src/messaging/sqs.ts";
import { type Broker, handlers } from "./messaging-shared.ts";

const scripts = new URL("../scripts/", import.meta.url).pathname;
let started: { stop(): void }[] = [];
let kafkaUrl = process.env.KAFKA_URL;
let sqsUrl = process.env.SQS_URL;

/** Where Kafka and SQS are (after `startBenchBrokers`, or from KAFKA_URL and SQS_URL). */
export function benchBrokerUrls(): { kafka?: string; sqs?: string } {
  return { kafka: kafkaUrl, sqs: sqsUrl };
}

/** Start what is not configured (see the module's notes), of `which` (default both). */
export function startBenchBrokers(which: ("kafka" | "sqs")[] = ["kafka", "sqs"]): void {
  const dir = mkdtempSync(join(tmpdir(), "idem-bench-brokers-"));
  const sh = (script: string, ...args: string[]) =>
    execFileSync("bash", [join(scripts, script), ...args], { encoding: "utf8" })
      .trim()
      .split("\n")
      .at(-1)!;
  if (!kafkaUrl && which.includes("kafka")) {
    kafkaUrl = sh("kafka.sh", "start", join(dir, "kafka"), process.env.BENCH_KAFKA_PORT ?? "25100");
    started.push({ stop: () => sh("kafka.sh", "stop", join(dir, "kafka")) });
  }
  if (!sqsUrl && which.includes("sqs")) {
    sqsUrl = sh("elasticmq.sh", "start", join(dir, "sqs"), process.env.BENCH_SQS_PORT ?? "25120");
    started.push({ stop: () => sh("elasticmq.sh", "stop", join(dir, "sqs")) });
  }
  started.push({ stop: () => rmSync(dir, { recursive: true, force: true }) });
}

export function stopBenchBrokers(): void {
  for (const s of started) s.stop();
  started = [];
  kafkaUrl = process.env.KAFKA_URL;
  sqsUrl = process.env.SQS_URL;
}

export async function kafka(): Promise<Broker> {
  const brokers = kafkaUrl!;
  const topic = `idem_bench_${Date.now()}`;
  const admin = new Admin({
    clientId: "idem-bench",
    bootstrapBrokers: brokers.replace(/^kafka:\/\//, "").split(","),
  });
  await admin.createTopics({ topics: [topic], partitions: 6, replicas: 1 });
  return {
    name: "Kafka",
    process: "kafka.Kafka",
    topic,
    publisher: () => new KafkaPublisher({ brokers }),
    consume: (db, consumer, style) =>
      consumeKafka({
        brokers,
        topics: topic,
        groupId: `${topic}_${consumer}`,
        inbox: new Inbox(db, { consumer }),
        ...handlers(style),
        prefetch: 2_048,
      }),
    async reset() {
      // Everything stored so far goes: later consumers start from the first record written after.
      const partitions = Array.from({ length: 6 }, (_, partition) => ({ partition, offset: -1n }));
      await admin.deleteRecords({ topics: [{ name: topic, partitions }] });
    },
    async cleanup() {
      await admin.deleteTopics({ topics: [topic] }).catch(() => {});
      await admin.close();
    },
  };
}

const sqsConfig = (): SQSClientConfig => ({
  endpoint: sqsUrl!,
  region: process.env.AWS_REGION ?? "us-east-1",
  ...(process.env.AWS_ACCESS_KEY_ID ? {} : { credentials: { accessKeyId: "idem", secretAccessKey: "idem" } }),
});

/** SQS with a standard queue (`fifo`: a FIFO queue, the aggregate as the message group). */
export async function sqs(fifo = false): Promise<Broker> {
  const client = new SQSClient(sqsConfig());
  const topic = `idem_bench_${Date.now()}${fifo ? ".fifo" : ""}`;
  const { QueueUrl } = await client.send(
    new CreateQueueCommand({ QueueName: topic, Attributes: fifo ? { FifoQueue: "true" } : {} }),
  );
  return {
    name: fifo ? "SQS FIFO" : "SQS",
    process: "org.elasticmq.server.Main",
    topic,
    publisher: () => new SqsPublisher({ clientConfig: sqsConfig() }),
    consume: (db, consumer, style) =>
      consumeSqs({
        clientConfig: sqsConfig(),
        queue: topic,
        waitTimeSec: 1,
        inbox: new Inbox(db, { consumer }),
        ...handlers(style),
        prefetch: 1_000,
      }),
    async reset() {
      await client.send(new PurgeQueueCommand({ QueueUrl }));
    },
    async cleanup() {
      await client.send(new DeleteQueueCommand({ QueueUrl })).catch(() => {});
      client.destroy();
    },
  };
}
