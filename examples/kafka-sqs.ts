// Events through Kafka and through SQS, each effect applied once however often its event arrives.
// Needs PostgreSQL and the brokers (scripts/kafka.sh and scripts/elasticmq.sh start local ones):
//   DATABASE_URL=postgres://... KAFKA_URL=kafka://127.0.0.1:25000 SQS_URL=http://127.0.0.1:25020 \
//   AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x npx tsx --conditions=source examples/kafka-sqs.ts
import { randomUUID } from "node:crypto";
import { CreateQueueCommand, SQSClient } from "@aws-sdk/client-sqs";
import { Admin } from "@platformatic/kafka";
import { Inbox, type InboxHandler, Relay, type RunningConsumer } from "idem/messaging";
import { consumeKafka, KafkaPublisher, kafkaBrokers } from "idem/messaging/kafka";
import { consumeSqs, SqsPublisher } from "idem/messaging/sqs";
import { fromPg, migrate, writeOutbox } from "idem/postgres";
import pg from "pg";

const { DATABASE_URL, KAFKA_URL, SQS_URL } = process.env;
if (!DATABASE_URL || !KAFKA_URL || !SQS_URL) throw new Error("set DATABASE_URL, KAFKA_URL and SQS_URL");
const pool = new pg.Pool({ connectionString: DATABASE_URL });
const db = fromPg(pool);
await migrate(db);
await db.exec("CREATE TABLE IF NOT EXISTS receipts (event_id text PRIMARY KEY, order_id text)");
const run = randomUUID().slice(0, 8); // this run's topic and queue

// #region snippet
// The effect: in the inbox's transaction, so it commits with the event's mark, once per event.
const sendReceipt: InboxHandler = async (tx, event) => {
  const { order } = JSON.parse(event.body);
  await tx.query("INSERT INTO receipts (event_id, order_id) VALUES ($1, $2)", [event.id, order]);
};

// Kafka: the aggregate id is the record key (one partition per order, so its events keep their order).
const topic = `orders-${run}`;
const admin = new Admin({ clientId: "example", bootstrapBrokers: kafkaBrokers(KAFKA_URL) });
await admin.createTopics({ topics: [topic], partitions: 3, replicas: 1 });
await admin.close();
const kafka = await consumeKafka({
  brokers: KAFKA_URL,
  topics: topic,
  groupId: "receipts",
  inbox: new Inbox(db, { consumer: "kafka-receipts" }),
  handler: sendReceipt,
});

// SQS: a FIFO queue takes the aggregate id as MessageGroupId and the event id as deduplication id.
const queue = `orders-${run}.fifo`;
const sqsClient = new SQSClient({ endpoint: SQS_URL });
await sqsClient.send(new CreateQueueCommand({ QueueName: queue, Attributes: { FifoQueue: "true" } }));
const sqs = await consumeSqs({
  client: sqsClient,
  queue,
  waitTimeSec: 1,
  inbox: new Inbox(db, { consumer: "sqs-receipts" }),
  handler: sendReceipt,
});

// Three orders paid; each event written in the payment's transaction, for both brokers.
for (const order of ["o1", "o2", "o3"]) {
  await db.transaction(async (tx) => {
    for (const to of [topic, queue]) {
      await writeOutbox(tx, {
        topic: to,
        type: "order.paid",
        payload: { order },
        aggregateType: "order",
        aggregateId: order,
      });
    }
  });
}
const publishers = [new KafkaPublisher({ brokers: KAFKA_URL }), new SqsPublisher({ client: sqsClient })];
const relays = [
  new Relay({ db, publisher: publishers[0]!, topics: [topic], orderByAggregate: true }),
  new Relay({ db, publisher: publishers[1]!, topics: [queue], orderByAggregate: true }),
];
for (const relay of relays) await relay.runOnce();
// As if a relay had died before marking: every event goes out again. No second receipt.
await db.query("UPDATE idem.outbox SET published_at = NULL WHERE topic = ANY($1)", [[topic, queue]]);
for (const relay of relays) await relay.runOnce();
// #endregion snippet

async function settle(name: string, c: RunningConsumer, copies: number): Promise<void> {
  const end = Date.now() + 30_000;
  while (c.stats.applied + c.stats.duplicates < copies && Date.now() < end)
    await new Promise((r) => setTimeout(r, 50));
  await c.stop();
  console.log(`${name}: applied ${c.stats.applied}, duplicates ${c.stats.duplicates}`);
}
await settle("kafka", kafka, 6); // Kafka stores both copies; the inbox drops the second of each
await settle("sqs", sqs, 3); // the FIFO queue drops the copies itself
const { rows } = await db.query<{ n: string }>("SELECT count(*) AS n FROM receipts");
console.log(`receipts: ${rows[0]!.n}`); // three orders, once through each broker
for (const p of publishers) await p.close();
sqsClient.destroy();
await pool.end();
