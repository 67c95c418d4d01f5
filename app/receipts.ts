/**
 * The receipt-email worker of the reference service: payment -> outbox -> broker -> inbox -> email.
 *
 * The payments route writes a `receipt-email` event into the outbox in the same transaction as the
 * payment. Here a relay publishes those events and a consumer "sends" each receipt (records it in
 * `sent_emails`, standing in for the email provider) through the inbox, so a receipt is recorded once
 * however often its event is delivered.
 *
 * Transport: RabbitMQ when AMQP_URL is set, NATS JetStream when NATS_URL is set, otherwise an in-process
 * broker that confirms a publish only once the receipt is recorded (so a restart loses nothing: the
 * relay publishes again whatever was not confirmed, and the inbox drops what was already sent).
 *
 *   const receipts = await startReceipts(db, loadConfig(process.env).receipts);
 *   ...
 *   await receipts.stop(); // before closing the database
 */
import {
  Inbox,
  type Listen,
  MemoryBroker,
  type Publisher,
  Relay,
  type RunningConsumer,
} from "idem/messaging";
import type { Db, Tx } from "idem/postgres";

export const RECEIPT_TOPIC = "receipt-email";
const CONSUMER = "receipt-email-worker";
const NATS_STREAM = "IDEM_RECEIPTS";

export interface ReceiptsConfig {
  /** RabbitMQ URL (AMQP_URL). */
  amqpUrl?: string;
  /** NATS URL(s), comma-separated (NATS_URL). Used when `amqpUrl` is not set. */
  natsUrl?: string;
  /** Wake the relay on NOTIFY (e.g. `listenWithPg(...)`); without it the relay polls every `pollMs`. */
  listen?: Listen;
  /** How often the relay polls. Default 1,000 ms with `listen`, 200 ms without. */
  pollMs?: number;
  /**
   * Prefix of the broker-side names (AMQP queue, NATS stream and subject), for running several
   * instances (or tests) against one broker. Default: none (queue and subject `receipt-email`, stream
   * `IDEM_RECEIPTS`).
   */
  namespace?: string;
  /** Where log lines go. Default: stderr as JSON. */
  log?: (line: Record<string, unknown>) => void;
}

export interface Receipts {
  /** "rabbitmq", "nats" or "in-process". */
  readonly transport: string;
  readonly relay: Relay;
  readonly consumer: RunningConsumer;
  stop(): Promise<void>;
}

/** The receipt worker's table (made by app/database.ts's `prepareSchema`, the owner's job). */
export const RECEIPT_TABLES = `
  CREATE TABLE IF NOT EXISTS sent_emails (
    message_id   text PRIMARY KEY,          -- the outbox event id: one email per event
    payment_id   text NOT NULL,
    account_id   text NOT NULL,
    amount_cents bigint NOT NULL,
    sent_at      timestamptz NOT NULL DEFAULT now()
  );
  CREATE INDEX IF NOT EXISTS sent_emails_payment ON sent_emails (payment_id);
`;

interface ReceiptPayload {
  payment: string;
  account: string;
  amount_cents: number;
}

/** "Send" one receipt: in the inbox's transaction, so it is recorded once per event. */
async function sendReceipt(tx: Tx, message: { id: string; body: string }): Promise<void> {
  const p = JSON.parse(message.body) as ReceiptPayload;
  if (!p.payment || !p.account) throw new Error("receipt-email event without payment or account");
  await tx.query(
    "INSERT INTO sent_emails (message_id, payment_id, account_id, amount_cents) VALUES ($1, $2, $3, $4)",
    [message.id, p.payment, p.account, p.amount_cents],
  );
}

/** Start the relay and the consumer. Resolves once both run. */
export async function startReceipts(db: Db, config: ReceiptsConfig = {}): Promise<Receipts> {
  const log = config.log ?? ((l) => console.error(JSON.stringify(l)));
  const onError = (err: Error) => log({ worker: "receipts", error: err.message });
  const inbox = new Inbox(db, { consumer: CONSUMER, maxAttempts: 5, onError: (e) => onError(e) });
  let publisher: Publisher;
  let consumer: RunningConsumer;
  let transport: string;
  const ns = config.namespace ?? "";
  const brokerTopic = `${ns}${RECEIPT_TOPIC}`;
  const stream = `${ns.toUpperCase().replace(/[^A-Z0-9_]/g, "_")}${NATS_STREAM}`;
  if (config.amqpUrl) {
    const { AmqpPublisher, consumeAmqp } = await import("idem/messaging/amqp");
    const setup = async (ch: { assertQueue(q: string, o: { durable: boolean }): Promise<unknown> }) => {
      await ch.assertQueue(brokerTopic, { durable: true });
    };
    publisher = new AmqpPublisher({ url: config.amqpUrl, setup, routingKey: () => brokerTopic });
    consumer = await consumeAmqp({
      url: config.amqpUrl,
      queue: brokerTopic,
      setup,
      inbox,
      handler: sendReceipt,
      onError,
    });
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
      durable: CONSUMER,
      create: { filterSubject: brokerTopic },
      inbox,
      handler: sendReceipt,
      onError,
    });
    consumer = {
      stats: inner.stats,
      closed: inner.closed,
      async stop() {
        await inner.stop();
        await nc.drain().catch(() => {});
      },
    };
    transport = "nats";
  } else {
    const broker = new MemoryBroker({ confirmOnConsume: true });
    publisher = broker.publisher();
    consumer = broker.consume(RECEIPT_TOPIC, { inbox, handler: sendReceipt, onError, concurrency: 1 });
    transport = "in-process";
  }
  const relay = new Relay({
    db,
    publisher,
    topics: [RECEIPT_TOPIC],
    ...(config.listen ? { listen: config.listen } : {}),
    pollMs: config.pollMs ?? (config.listen ? 1_000 : 200),
    onError,
  });
  await relay.start();
  return {
    transport,
    relay,
    consumer,
    async stop() {
      await relay.stop();
      await consumer.stop();
      await publisher.close();
    },
  };
}

/** Receipts recorded for a payment (for the playground and tests). */
export async function receiptsOf(db: Db, paymentId: string): Promise<{ messageId: string; sentAt: Date }[]> {
  const { rows } = await db.query<{ message_id: string; sent_at: Date | string }>(
    "SELECT message_id, sent_at FROM sent_emails WHERE payment_id = $1 ORDER BY sent_at",
    [paymentId],
  );
  return rows.map((r) => ({ messageId: r.message_id, sentAt: new Date(r.sent_at) }));
}
