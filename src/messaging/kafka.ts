/**
 * Apache Kafka through `@platformatic/kafka`: a publisher for the relay (the idempotent producer,
 * `acks=all`, the aggregate id as the record key so that an aggregate's events share a partition and
 * keep their order, the event id in an `idem-id` header) and an inbox consumer (kafka-consumer.ts).
 *
 * Why this client: it is pure JavaScript (nothing native to build or download at install, unlike the
 * librdkafka bindings of `@confluentinc/kafka-javascript`), maintained and released often, and speaks
 * the current protocol (KRaft-era brokers, fetch sessions, topic ids). KafkaJS, the most used one, has
 * had no release since 2023. It needs Node.js 22.22+ (or 24.6+); the rest of idem runs on 20.19+.
 *
 * Kafka has no field for a message id, so the event id travels in the `idem-id` header; the record's
 * offset differs between two copies of one event (a relay that published and died before marking
 * publishes again) and is never used to deduplicate.
 */
import type { MessageToProduce, Producer, ProducerOptions } from "@platformatic/kafka";
import { kafkaBrokers, kafkaLibrary, kafkaUnavailable } from "./kafka-client.ts";
import {
  BrokerUnavailableError,
  errorOf,
  MESSAGE_ID_HEADER,
  type OutboxMessage,
  type Publisher,
  type PublishOutcome,
  wireHeaders,
} from "./types.ts";

export { kafkaBrokers } from "./kafka-client.ts";
export { consumeKafka, type KafkaConsumerOptions, type KafkaDelivery } from "./kafka-consumer.ts";

/** Options of {@link KafkaPublisher}. Only `brokers` is required. */
export interface KafkaPublisherOptions {
  /** Bootstrap brokers: `host:port`, several comma-separated, or `kafka://host:port,...`. */
  brokers: string | readonly string[];
  /** The client id the brokers see. Default `"idem-relay"`. */
  clientId?: string;
  /** The topic of a message. Default: its outbox topic. */
  topic?: (m: OutboxMessage) => string;
  /**
   * The record key, which picks the partition. Default: the aggregate id, so that an aggregate's
   * events land in one partition in the order published; events without one get no key (spread).
   */
  key?: (m: OutboxMessage) => string | null;
  /**
   * How long one `publish` may take. Past it the batch is put back (no attempt counted) and goes out
   * again later; the copies the brokers did store meanwhile are dropped by the consumers' inboxes.
   * Default 15,000 ms.
   */
  timeoutMs?: number;
  /** More client options (TLS, SASL, timeouts...), passed to the producer. */
  clientOptions?: Partial<ProducerOptions<string, string, string, string>>;
}

/**
 * Publishes outbox batches to Kafka with the idempotent producer (`acks=all`: a record is confirmed
 * once the partition's in-sync replicas have it; the broker drops a producer retry's copy by sequence
 * number). One producer sends a call's records to each partition in the call's order, one request at
 * a time, so `keepsOrder` holds and an ordered relay may `pipeline`.
 */
export class KafkaPublisher implements Publisher {
  /** Always `"kafka"`: the publisher's name in logs and metrics. */
  readonly name = "kafka";
  /** A call's records reach each partition in the call's order (idempotent producer, one in flight). */
  readonly keepsOrder = true;
  readonly #options: KafkaPublisherOptions;
  readonly #brokers: string[];
  #producer: Promise<Producer<string, string, string, string>> | undefined;

  constructor(options: KafkaPublisherOptions) {
    this.#options = options;
    this.#brokers = kafkaBrokers(options.brokers);
  }

  #get(): Promise<Producer<string, string, string, string>> {
    this.#producer ??= kafkaLibrary().then(
      (lib) =>
        new lib.Producer<string, string, string, string>({
          clientId: this.#options.clientId ?? "idem-relay",
          bootstrapBrokers: this.#brokers,
          serializers: lib.stringSerializers,
          idempotent: true,
          acks: lib.ProduceAcks.ALL,
          // Finite: a cluster that stays away fails the call, and the relay puts the batch back.
          retries: 5,
          retryDelay: 250,
          connectTimeout: 5_000,
          ...this.#options.clientOptions,
        }),
    );
    return this.#producer;
  }

  #record(m: OutboxMessage): MessageToProduce<string, string, string, string> {
    const key = this.#options.key ? this.#options.key(m) : m.aggregateId;
    return {
      topic: this.#options.topic?.(m) ?? m.topic,
      ...(key === null ? {} : { key }),
      value: m.body,
      headers: { ...wireHeaders(m), [MESSAGE_ID_HEADER]: m.id },
    };
  }

  /** Send `messages` in one call; throws BrokerUnavailableError when the cluster is away. */
  async #send(messages: readonly OutboxMessage[]): Promise<void> {
    const producer = await this.#get();
    const timeoutMs = this.#options.timeoutMs ?? 15_000;
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        producer.send({ messages: messages.map((m) => this.#record(m)) }),
        new Promise<never>((_, reject) => {
          timer = setTimeout(
            () => reject(new BrokerUnavailableError(`Kafka did not confirm within ${timeoutMs} ms`)),
            timeoutMs,
          );
        }),
      ]);
    } catch (err) {
      if (err instanceof BrokerUnavailableError) throw err;
      if (kafkaUnavailable(err)) {
        throw new BrokerUnavailableError(`Kafka unavailable: ${errorOf(err).message}`, { cause: err });
      }
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Publish a batch; one outcome per message. Calls made while a send is on its way go out together in
   * the next one (an ordered relay's chains make one call per aggregate, each of one event): the
   * producer has one request in flight at a time, so this is what keeps it busy. A send the cluster
   * refused for another reason than being away (a record too large, a topic that does not exist) is
   * made again one message at a time, in order, so that only the messages at fault fail.
   */
  publish(messages: readonly OutboxMessage[]): Promise<PublishOutcome[]> {
    if (messages.length === 0) return Promise.resolve([]);
    return new Promise((resolve, reject) => {
      this.#calls.push({ messages, resolve, reject });
      if (!this.#sending) {
        this.#sending = true;
        setImmediate(() => void this.#flush());
      }
    });
  }

  readonly #calls: {
    messages: readonly OutboxMessage[];
    resolve: (o: PublishOutcome[]) => void;
    reject: (e: Error) => void;
  }[] = [];
  #sending = false;

  async #flush(): Promise<void> {
    while (this.#calls.length > 0) {
      const calls = this.#calls.splice(0);
      const all = calls.flatMap((c) => c.messages);
      let outcomes: PublishOutcome[] | undefined;
      try {
        await this.#send(all);
        outcomes = all.map(() => ({ ok: true }));
      } catch (err) {
        if (err instanceof BrokerUnavailableError) {
          for (const c of calls) c.reject(err);
          continue;
        }
        if (all.length === 1) outcomes = [{ ok: false, error: errorOf(err) }];
      }
      if (!outcomes) {
        outcomes = [];
        for (const m of all) {
          try {
            await this.#send([m]);
            outcomes.push({ ok: true });
          } catch (err) {
            outcomes.push({ ok: false, error: errorOf(err) });
          }
        }
      }
      let at = 0;
      for (const c of calls) {
        c.resolve(outcomes.slice(at, at + c.messages.length));
        at += c.messages.length;
      }
    }
    this.#sending = false;
  }

  /** Close the producer. */
  async close(): Promise<void> {
    const p = this.#producer;
    this.#producer = undefined;
    const producer = await p?.catch(() => undefined);
    await producer?.close().catch(() => {});
  }
}
