/**
 * A consumer in a process of its own, for the fault tests to kill with SIGKILL mid-batch:
 *
 *   node --conditions=source --import tsx test/messaging/fault-worker.ts kafka|sqs DATABASE_URL NAME MEMBER
 *
 * Kafka: joins group NAME on topic NAME (IDEM_TEST_KAFKA, or FAULT_BROKERS); SQS: consumes queue NAME
 * (IDEM_TEST_SQS) with a 2 s visibility timeout. Each message is logged by `faultEffect` with MEMBER.
 * Prints "ready" once consuming; stops on SIGTERM.
 */
import pg from "pg";
import { Inbox } from "../../src/messaging/inbox.ts";
import { consumeKafka } from "../../src/messaging/kafka.ts";
import { consumeSqs } from "../../src/messaging/sqs.ts";
import { fromPg } from "../../src/postgres/drivers/pg.ts";
import { sqsClientConfig } from "./brokers.ts";
import { faultEffect } from "./fault-effects.ts";

const [kind, url, name, member] = process.argv.slice(2) as [string, string, string, string];
const pool = new pg.Pool({ connectionString: url, max: 8 });
const db = fromPg(pool);
const inbox = new Inbox(db, { consumer: name });
const common = { inbox, batchHandler: faultEffect(member), onError: () => {} };
const consumer =
  kind === "kafka"
    ? await consumeKafka({
        ...common,
        brokers: process.env.FAULT_BROKERS ?? process.env.IDEM_TEST_KAFKA!,
        topics: name,
        groupId: name,
        sessionTimeoutMs: 6_000,
        prefetch: 200,
        batchSize: 50,
      })
    : await consumeSqs({
        ...common,
        clientConfig: sqsClientConfig(process.env.IDEM_TEST_SQS!),
        queue: name,
        visibilityTimeoutSec: 2,
        waitTimeSec: 1,
        prefetch: 50,
        batchSize: 20,
      });
console.log("ready");
process.once("SIGTERM", async () => {
  await consumer.stop();
  await pool.end();
  process.exit(0);
});
