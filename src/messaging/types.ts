/**
 * What travels between the outbox, the brokers and the inbox.
 *
 * An event keeps one id from the moment it is written into the outbox: the relay publishes it as the
 * broker's message id (AMQP `messageId`, NATS `Nats-Msg-Id`, the webhook's `webhook-id` header, the
 * `idem-id` header on Kafka and attribute on SQS), and a consumer deduplicates on it. Broker-assigned
 * numbers (delivery tags, stream sequences, offsets) differ between two copies of one event and are
 * never used for deduplication.
 */

/** An outbox row as the relay hands it to a publisher. */
export interface OutboxMessage {
  /** The event id (a UUIDv7): the message id on every broker. */
  id: string;
  /** A queue or routing key (AMQP), a subject (NATS), a Kafka topic, an SQS queue, a webhook topic. */
  topic: string;
  /** What happened, e.g. `"payment.succeeded"`. */
  type: string;
  /** The event's JSON body, already serialised. */
  body: string;
  /** The event's own headers, published with it. */
  headers: Record<string, string>;
  /** The aggregate's type, e.g. `"order"`; null when the event has none. */
  aggregateType: string | null;
  /** The aggregate's id; null when the event has none. */
  aggregateId: string | null;
  /** Failed publish attempts before this one. */
  attempts: number;
  /** When the event was written. */
  createdAt: Date;
}

/** How one message of a batch fared. */
export type PublishOutcome =
  | {
      ok: true;
      /** The broker said it already had a message with this id (NATS JetStream dedup window). */
      duplicate?: boolean;
    }
  | { ok: false; error: Error };

/**
 * A broker, as the relay sees it. `publish` resolves once the broker has confirmed (or refused) every
 * message, with one outcome per message in order. It throws {@link BrokerUnavailableError} when it
 * could not even reach the broker (no message is at fault, so no attempt is counted); any other throw
 * counts as a failure of every message of the batch.
 */
export interface Publisher {
  /** For logs: `"amqp"`, `"nats"`, `"webhook"`, `"memory"`... */
  readonly name: string;
  /** Publish a batch; resolves with one outcome per message, in order, once the broker answered. */
  publish(messages: readonly OutboxMessage[]): Promise<PublishOutcome[]>;
  /**
   * Close the publisher's connections (`Relay.stop()` calls it). A `publish` after it connects again, so
   * a publisher shared by relays, or a relay started again, goes on working.
   */
  close(): Promise<void>;
  /**
   * True when the messages of one `publish` call reach the broker, and are stored, in the call's order
   * (one connection, one channel). Lets an ordered relay `pipeline` an aggregate's events.
   */
  readonly keepsOrder?: boolean;
}

/** A message as a consumer receives it, whichever broker brought it. */
export interface Delivery {
  /** The producer's message id (the outbox event id). */
  id: string;
  /** The queue, subject or topic it came from. */
  topic: string;
  /** What happened, e.g. `"payment.succeeded"` (the `idem-type` header). */
  type: string;
  /** The raw body (UTF-8), kept for parking. */
  body: string;
  /** The message's headers. */
  headers: Record<string, string>;
  /** The broker says this is not the first delivery (it may still be the first to be processed). */
  redelivered: boolean;
}

/** The broker cannot be reached at all: the batch is put back without counting an attempt. */
export class BrokerUnavailableError extends Error {
  /** Always `"BrokerUnavailableError"`: the name logs and stack traces show. */
  override readonly name = "BrokerUnavailableError";
  /** Always `"IDEM_BROKER_UNAVAILABLE"`: a code to check that does not depend on the class. */
  readonly code = "IDEM_BROKER_UNAVAILABLE";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** A delivery that carries no producer message id: it cannot be deduplicated, so it is refused. */
export class MissingMessageIdError extends Error {
  /** Always `"MissingMessageIdError"`: the name logs and stack traces show. */
  override readonly name = "MissingMessageIdError";
  /** Always `"IDEM_MISSING_MESSAGE_ID"`: a code to check that does not depend on the class. */
  readonly code = "IDEM_MISSING_MESSAGE_ID";
}

/** Whether `err` is a {@link BrokerUnavailableError} (the broker could not be reached at all). */
export function isBrokerUnavailable(err: unknown): err is BrokerUnavailableError {
  return err instanceof BrokerUnavailableError;
}

/**
 * The header (Kafka) or message attribute (SQS) that carries the event id on brokers without a message
 * id field of their own.
 */
export const MESSAGE_ID_HEADER = "idem-id";

/** Header names idem adds to every published message (besides the broker's own message id field). */
export const HEADERS = {
  type: "idem-type",
  aggregateType: "idem-aggregate-type",
  aggregateId: "idem-aggregate-id",
} as const;

/** The headers a publisher sends: the event's own, plus its type and aggregate. */
export function wireHeaders(m: OutboxMessage): Record<string, string> {
  const h: Record<string, string> = { ...m.headers, [HEADERS.type]: m.type };
  if (m.aggregateType !== null) h[HEADERS.aggregateType] = m.aggregateType;
  if (m.aggregateId !== null) h[HEADERS.aggregateId] = m.aggregateId;
  return h;
}

export function errorOf(err: unknown): Error {
  return err instanceof Error ? err : new Error(String(err));
}
