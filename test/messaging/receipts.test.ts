/** The reference service's receipt-email worker: payment -> outbox -> broker -> inbox -> one email. */

import { DeleteQueueCommand, GetQueueUrlCommand, SQSClient } from "@aws-sdk/client-sqs";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect as natsConnect } from "@nats-io/transport-node";
import { Admin } from "@platformatic/kafka";
import amqp from "amqplib";
import { describe, expect, it } from "vitest";
import { prepareSchema } from "../../app/database.ts";
import { RECEIPT_TOPIC, type ReceiptsConfig, receiptsOf, startReceipts } from "../../app/receipts.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { backends, serverBackends } from "../helpers/db.ts";
import { KAFKA, NO_KAFKA, NO_SQS, SQS, sqsClientConfig } from "./brokers.ts";
import { AMQP_URL, NATS_URL, unique, until } from "./helpers.ts";

const pglite = backends.find((b) => b.name === "pglite")!;
const pgBackend = serverBackends.find((b) => b.name === "pg");

const transports: {
  name: string;
  backend: typeof pglite | undefined;
  config: (ns: string) => ReceiptsConfig;
  cleanup(ns: string): Promise<void>;
}[] = [
  { name: "in-process", backend: pglite, config: () => ({}), cleanup: async () => {} },
  {
    name: "rabbitmq",
    backend: pgBackend,
    config: (ns) => ({ amqpUrl: AMQP_URL, namespace: ns }),
    async cleanup(ns) {
      const c = await amqp.connect(AMQP_URL);
      const ch = await c.createChannel();
      await ch.deleteQueue(`${ns}${RECEIPT_TOPIC}`).catch(() => {});
      await c.close();
    },
  },
  {
    name: "nats",
    backend: pgBackend,
    config: (ns) => ({ natsUrl: NATS_URL, namespace: ns }),
    async cleanup(ns) {
      const nc = await natsConnect({ servers: NATS_URL });
      await (await jetstreamManager(nc)).streams.delete(`${ns.toUpperCase()}IDEM_RECEIPTS`).catch(() => {});
      await nc.close();
    },
  },
  {
    name: "kafka",
    backend: NO_KAFKA ? undefined : pgBackend,
    config: (ns) => ({ kafkaUrl: KAFKA, namespace: ns }),
    async cleanup(ns) {
      const admin = new Admin({ clientId: "idem-test", bootstrapBrokers: KAFKA!.split(",") });
      await admin.deleteTopics({ topics: [`${ns}${RECEIPT_TOPIC}`] }).catch(() => {});
      await admin.close();
    },
  },
  {
    name: "sqs",
    backend: NO_SQS ? undefined : pgBackend,
    config: (ns) => {
      // The service takes region and credentials from the AWS environment, as on AWS.
      Object.assign(process.env, {
        AWS_REGION: "us-east-1",
        AWS_ACCESS_KEY_ID: "idem",
        AWS_SECRET_ACCESS_KEY: "idem",
      });
      return { sqsUrl: SQS, namespace: ns };
    },
    async cleanup(ns) {
      const sqs = new SQSClient(sqsClientConfig());
      const { QueueUrl } = await sqs.send(new GetQueueUrlCommand({ QueueName: `${ns}${RECEIPT_TOPIC}` }));
      await sqs.send(new DeleteQueueCommand({ QueueUrl })).catch(() => {});
      sqs.destroy();
    },
  },
];

describe.each(transports)("receipt-email worker over $name", ({ name, backend, config, cleanup }) => {
  it.skipIf(!backend)(
    "records one email per payment, however often its event is delivered",
    async () => {
      const { db, close } = await backend!.open();
      const ns = unique("rcpt_");
      const quiet = { log: () => {} };
      try {
        await prepareSchema(db); // idem's migrations and the service's tables, sent_emails among them
        const receipts = await startReceipts(db, { ...config(ns), ...quiet });
        expect(receipts.transport).toBe(name);
        const ids: string[] = [];
        try {
          for (let i = 0; i < 20; i++) {
            await db.transaction(async (tx) => {
              ids.push(
                await writeOutbox(tx, {
                  topic: RECEIPT_TOPIC,
                  type: "payment.succeeded",
                  aggregateType: "payment",
                  aggregateId: `pay_${i}`,
                  payload: { payment: `pay_${i}`, account: "acct_1", amount_cents: 100 + i },
                }),
              );
            });
          }
          await until(async () => (await receiptsOf(db, "pay_19")).length === 1, 15_000, "the last receipt");
          // A relay that died before marking: every event goes out again; no second email.
          await db.query("UPDATE idem.outbox SET published_at = NULL");
          receipts.relay.wake();
          // (JetStream itself drops copies within its duplicate window and says so in the publish ack.)
          await until(
            () => receipts.consumer.stats.duplicates + receipts.relay.stats.duplicates >= 20,
            15_000,
            "the copies absorbed",
          );
        } finally {
          await receipts.stop();
        }
        const { rows } = await db.query<{ n: string; d: string }>(
          "SELECT count(*) AS n, count(DISTINCT payment_id) AS d FROM sent_emails",
        );
        expect({ emails: Number(rows[0]!.n), payments: Number(rows[0]!.d) }).toEqual({
          emails: 20,
          payments: 20,
        });
        expect((await receiptsOf(db, "pay_3"))[0]!.messageId).toBe(ids[3]);
      } finally {
        await close();
        await cleanup(ns);
      }
      // Its own bounds judge it (the schema, then 15 s for the receipts and 15 s for the copies, each
      // failing with what it waited for); vitest's 30 s default was less than their sum.
    },
    90_000,
  );
});
