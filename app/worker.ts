/**
 * One topic's worker of the reference service: a relay publishing the topic's outbox events and a
 * consumer applying them through the inbox (the receipt emails, app/receipts.ts; the checkout saga,
 * app/checkout/worker.ts).
 *
 * Transport: RabbitMQ when AMQP_URL is set, NATS JetStream when NATS_URL is set, Kafka when KAFKA_URL is
 * set, SQS when SQS_URL is set (in that order of preference), otherwise an in-process broker that
 * confirms a publish only once the message is applied (so a restart loses nothing: the relay publishes
 * again whatever was not confirmed, and the inbox drops what was already applied).
 */
import {
  type ConsumerOptions,
  Inbox,
  type InboxHandler,
  type Listen,
  MemoryBroker,
  type Publisher,
  Relay,
  type RelayOptions,
  type RunningConsumer,
} from "idem/messaging";
import type { Db } from "idem/postgres";

/** Where a worker's messages travel (AMQP_URL, NATS_URL, KAFKA_URL, SQS_URL), and how its relay wakes. */
export interface TransportConfig {
  /** RabbitMQ URL (AMQP_URL). */
  amqpUrl?: string;
  /** NATS URL(s), comma-separated (NATS_URL). Used when `amqpUrl` is not set. */
  natsUrl?: string;
  /** Kafka brokers, `kafka://host:port,...` (KAFKA_URL). Used when neither of the above is set. */
  kafkaUrl?: string;
  /**
   * The SQS endpoint (SQS_URL), e.g. `https://sqs.eu-west-1.amazonaws.com`; region and credentials
   * come from the AWS environment. Used when none of the above is set.
   */
  sqsUrl?: string;
  /** Wake the relay on NOTIFY (e.g. `listenWithPg(...)`); without it the relay polls every `pollMs`. */
  listen?: Listen;
  /** How often the relay polls. Default 1,000 ms with `listen`, 200 ms without. */
  pollMs?: number;
  /**
   * Prefix of the broker-side names (AMQP queue, NATS stream and subject, Kafka topic and group, SQS
   * queue), for running several instances (or tests) against one broker. Default: none.
   */
  namespace?: string;
  /** NATS: how long JetStream waits for an ack before it redelivers. Default: the consumer's (30 s). */
  ackWaitMs?: number;
  /** Where log lines go. Default: stderr as JSON. */
  log?: (line: Record<string, unknown>) => void;
}

/** What a worker is: its topic, its consumer's name, and what applying a message does. */
export interface WorkerSpec {
  topic: string;
  consumer: string;
  /** The NATS stream's name (upper case, before the namespace). */
  stream: string;
  handler: InboxHandler;
  /** Attempts before a message is parked. Default 5. */
  maxAttempts?: number;
  /** For tests: the relay's and the consumer's crash points (the messaging fault suite). */
  relayCrash?: RelayOptions["crash"];
  consumerCrash?: ConsumerOptions["crash"];
  /** For tests: the relay's lease on the rows it claimed (a killed relay's rows wait for it). */
  relayLeaseMs?: number;
}

/** A worker at work. */
export interface Worker {
  /** "rabbitmq", "nats", "kafka", "sqs" or "in-process". */
  readonly transport: string;
  readonly relay: Relay;
  readonly consumer: RunningConsumer;
  stop(): Promise<void>;
}

/** `consumer`, whose `stop()` then closes the connection it was given. */
function closingAfter(consumer: RunningConsumer, close: () => Promise<void>): RunningConsumer {
  return {
    stats: consumer.stats,
    closed: consumer.closed,
    async stop() {
      await consumer.stop();
      await close();
    },
  };
}

/** Start a topic's relay and consumer. Resolves once both run. */
export async function startWorker(db: Db, spec: WorkerSpec, config: TransportConfig = {}): Promise<Worker> {
  const log = config.log ?? ((l) => console.error(JSON.stringify(l)));
  const onError = (err: Error) => log({ worker: spec.consumer, error: err.message });
  const inbox = new Inbox(db, { consumer: spec.consumer, maxAttempts: spec.maxAttempts ?? 5, onError });
  let publisher: Publisher;
  let consumer: RunningConsumer;
  let transport: string;
  const ns = config.namespace ?? "";
  const brokerTopic = `${ns}${spec.topic}`;
  const stream = `${ns.toUpperCase().replace(/[^A-Z0-9_]/g, "_")}${spec.stream}`;
  const consuming = { inbox, handler: spec.handler, onError, crash: spec.consumerCrash };
  if (config.amqpUrl) {
    const { AmqpPublisher, consumeAmqp } = await import("idem/messaging/amqp");
    const setup = async (ch: { assertQueue(q: string, o: { durable: boolean }): Promise<unknown> }) => {
      await ch.assertQueue(brokerTopic, { durable: true });
    };
    publisher = new AmqpPublisher({ url: config.amqpUrl, setup, routingKey: () => brokerTopic });
    consumer = await consumeAmqp({ url: config.amqpUrl, queue: brokerTopic, setup, ...consuming });
    transport = "rabbitmq";
  } else if (config.natsUrl) {
    const { connectNats, consumeNats, NatsPublisher } = await import("idem/messaging/nats");
    const { jetstreamManager } = await import("@nats-io/jetstream");
    const nc = await connectNats(config.natsUrl.split(","));
    const jsm = await jetstreamManager(nc);
    await jsm.streams.info(stream).catch(() => jsm.streams.add({ name: stream, subjects: [brokerTopic] }));
    publisher = new NatsPublisher({ connection: nc, subject: () => brokerTopic });
    const inner = await consumeNats({
      connection: nc,
      stream,
      durable: spec.consumer,
      create: { filterSubject: brokerTopic, ...(config.ackWaitMs ? { ackWaitMs: config.ackWaitMs } : {}) },
      ...consuming,
    });
    consumer = closingAfter(inner, () => nc.drain().catch(() => {}));
    transport = "nats";
  } else if (config.kafkaUrl) {
    const { consumeKafka, KafkaPublisher, kafkaBrokers } = await import("idem/messaging/kafka");
    const { Admin } = await import("@platformatic/kafka");
    const admin = new Admin({ clientId: spec.consumer, bootstrapBrokers: kafkaBrokers(config.kafkaUrl) });
    try {
      // Six partitions: messages of different aggregates go side by side, each aggregate's in order.
      await admin.createTopics({ topics: [brokerTopic], partitions: 6, replicas: -1 }).catch((err: Error) => {
        if (!/already exists/i.test(`${err.message} ${String((err as { errors?: unknown }).errors ?? "")}`))
          throw err;
      });
    } finally {
      await admin.close();
    }
    publisher = new KafkaPublisher({ brokers: config.kafkaUrl, topic: () => brokerTopic });
    consumer = await consumeKafka({
      brokers: config.kafkaUrl,
      topics: brokerTopic,
      groupId: `${ns}${spec.consumer}`,
      ...consuming,
    });
    transport = "kafka";
  } else if (config.sqsUrl) {
    const { consumeSqs, SqsPublisher } = await import("idem/messaging/sqs");
    const { CreateQueueCommand, SQSClient } = await import("@aws-sdk/client-sqs");
    const client = new SQSClient({ endpoint: config.sqsUrl });
    await client.send(new CreateQueueCommand({ QueueName: brokerTopic })); // returns the queue if it exists
    publisher = new SqsPublisher({ client, queue: () => brokerTopic });
    const inner = await consumeSqs({ client, queue: brokerTopic, waitTimeSec: 5, ...consuming });
    consumer = closingAfter(inner, async () => client.destroy());
    transport = "sqs";
  } else {
    const broker = new MemoryBroker({ confirmOnConsume: true });
    publisher = broker.publisher();
    consumer = broker.consume(spec.topic, { ...consuming, concurrency: 1 });
    transport = "in-process";
  }
  const relay = new Relay({
    db,
    publisher,
    topics: [spec.topic],
    ...(config.listen ? { listen: config.listen } : {}),
    pollMs: config.pollMs ?? (config.listen ? 1_000 : 200),
    onError,
    crash: spec.relayCrash,
    ...(spec.relayLeaseMs ? { leaseMs: spec.relayLeaseMs } : {}),
  });
  await relay.start();
  return {
    transport,
    relay,
    consumer,
    async stop() {
      await relay.stop(); // closes the publisher too
      await consumer.stop();
    },
  };
}
