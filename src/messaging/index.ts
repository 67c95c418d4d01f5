/**
 * `idem/messaging`: the outbox relay, the inbox, versioned upserts, webhooks and an in-process broker.
 * RabbitMQ, NATS JetStream, Kafka and SQS live in `idem/messaging/amqp`, `idem/messaging/nats`,
 * `idem/messaging/kafka` and `idem/messaging/sqs`, so that their client libraries (optional peer
 * dependencies) are only needed by those who use them.
 */

export {
  type Listen,
  ListenUnavailableError,
  listenWithPg,
  listenWithPglite,
  listenWithPostgresJs,
  type PgNotifyClient,
} from "../postgres/drivers/listen.ts";
export type {
  ConsumerCrashPoint,
  ConsumerOptions,
  ConsumerStats,
  DeliveryConsumerOptions,
  RunningConsumer,
} from "./consumer.ts";
export { type GaugeValues, IdemGauges } from "./gauges.ts";
export {
  Inbox,
  type InboxBatchHandler,
  type InboxHandler,
  type InboxOptions,
  InboxResult,
  type ParkedMessage,
  sweepInbox,
} from "./inbox.ts";
export { MemoryBroker, type MemoryBrokerOptions } from "./memory.ts";
export {
  outboxCounts,
  Relay,
  type RelayCrashPoint,
  type RelayOptions,
  type RelayStats,
  requeueParked,
} from "./relay.ts";
export {
  BrokerUnavailableError,
  type Delivery,
  HEADERS,
  isBrokerUnavailable,
  MESSAGE_ID_HEADER,
  MissingMessageIdError,
  type OutboxMessage,
  type Publisher,
  type PublishOutcome,
} from "./types.ts";
export { type VersionedUpsert, versionedUpsert } from "./versioned-upsert.ts";
export {
  signWebhook,
  verifyWebhook,
  WEBHOOK_HEADERS,
  WebhookPublisher,
  type WebhookPublisherOptions,
  type WebhookRejection,
  WebhookVerificationError,
} from "./webhook.ts";
