/**
 * A Kafka consumer group member that applies records through an inbox (see kafka.ts for the client).
 *
 * Timeline of one generation of the group (the client handles membership and heartbeats):
 *
 *   join      the group hands this member its partitions; each is read from its committed offset
 *             (from its first record when the group never committed one, with `fromBeginning`)
 *   fetch     one request at a time per partition leader, while fewer than `prefetch` records are in hand
 *   apply     records go through the inbox, batched; a key's records (the aggregate id the relay puts
 *             in the record key) are applied in offset order, one transaction after the other; other
 *             keys go on while one waits for a retry
 *   commit    after each transaction, the offset of each partition up to which every record is done
 *             (applied, a duplicate, parked) is committed: never a record whose effect has not committed
 *   revoke    before the member rejoins (a member joined or left, the group's coordinator asked),
 *             fetching stops, records not yet in a transaction are let go, and the member waits for
 *             the transactions under way; only then does it tell the coordinator it is ready (JoinGroup).
 *             So no effect commits for a partition after its revocation is acknowledged.
 *
 * A crash anywhere replays from the last committed offset: the inbox answers "duplicate" for what was
 * applied since. An offset commit that fails (a rebalance, a coordinator moving) is tried again after
 * the next transaction; a late one only ever names records already applied.
 */
import type { ConsumerOptions as ClientOptions, Consumer } from "@platformatic/kafka";
import {
  type ConsumerOptions,
  type DeliveryConsumerOptions,
  newStats,
  type RunningConsumer,
} from "./consumer.ts";
import { kafkaBrokers, kafkaLibrary, kafkaUnavailable } from "./kafka-client.ts";
import { type KafkaDelivery, KafkaSession, type SessionContext } from "./kafka-session.ts";
import { BrokerUnavailableError, errorOf } from "./types.ts";

export type { KafkaDelivery } from "./kafka-session.ts";

/** Options of {@link consumeKafka}. */
export interface KafkaConsumerOptions extends DeliveryConsumerOptions<KafkaDelivery> {
  /** Bootstrap brokers: `host:port`, several comma-separated, or `kafka://host:port,...`. */
  brokers: string | readonly string[];
  /** The topic(s) to read. */
  topics: string | readonly string[];
  /** The consumer group: the members of one group share the partitions. */
  groupId: string;
  /** Records in hand at once (fetched, not yet done). Default 1,000. */
  prefetch?: number;
  /** The client id the brokers see. Default `"idem-consumer"`. */
  clientId?: string;
  /** A member silent this long is taken out of the group. Default 10,000 ms. */
  sessionTimeoutMs?: number;
  /** Heartbeats to the group's coordinator. Default 1,000 ms. */
  heartbeatIntervalMs?: number;
  /** How long the group waits for its members to rejoin in a rebalance. Default 30,000 ms. */
  rebalanceTimeoutMs?: number;
  /** Read a partition the group never committed an offset for from its first record. Default true. */
  fromBeginning?: boolean;
  /** How long a fetch waits on the broker for records. Default 500 ms. */
  maxWaitMs?: number;
  /** More client options (TLS, SASL...), passed to the consumer. */
  clientOptions?: Partial<ClientOptions<Buffer, Buffer, Buffer, Buffer>>;
}

/**
 * Consume Kafka topics as a member of a consumer group, through an inbox: each record's effect and its
 * inbox mark commit together, and a partition's offset is committed only past records whose effect
 * committed. A record's key keeps its order: its records are applied one transaction after another, a
 * failing one is retried (after `retryDelayMs`) ahead of the later ones of its key, and parked at the
 * inbox's `maxAttempts`, after which its key goes on. A record without an `idem-id` header cannot be
 * deduplicated: it is refused (skipped) and counted in `stats.refused`.
 */
export async function consumeKafka(options: KafkaConsumerOptions): Promise<RunningConsumer> {
  const lib = await kafkaLibrary();
  const topics = typeof options.topics === "string" ? [options.topics] : [...options.topics];
  const stats = newStats();
  const onError = options.onError ?? (() => {});
  let session: KafkaSession | undefined;
  let stopping = false;
  let resolveClosed!: () => void;
  const closed = new Promise<void>((r) => {
    resolveClosed = r;
  });

  const context: SessionContext = {
    lib,
    topics,
    prefetch: Math.max(1, options.prefetch ?? 1_000),
    maxWaitMs: options.maxWaitMs ?? 500,
    fromBeginning: options.fromBeginning !== false,
    stats,
    common: options as unknown as ConsumerOptions,
    onError,
    crash: () => crash(),
    stopping: () => stopping,
  };

  /** Before every (re)join: end the current generation's work (see the timeline). */
  const revoke = async (): Promise<void> => {
    const s = session;
    session = undefined;
    if (!s) return;
    s.stop();
    await s.inFlight.drained();
  };

  const consumer: Consumer = new lib.Consumer({
    clientId: options.clientId ?? "idem-consumer",
    groupId: options.groupId,
    bootstrapBrokers: kafkaBrokers(options.brokers),
    autocommit: false,
    sessionTimeout: options.sessionTimeoutMs ?? 10_000,
    heartbeatInterval: options.heartbeatIntervalMs ?? 1_000,
    rebalanceTimeout: options.rebalanceTimeoutMs ?? 30_000,
    maxWaitTime: options.maxWaitMs ?? 500,
    retries: 3,
    retryDelay: 250,
    protocolsMetadata: async () => {
      await revoke();
      return Buffer.alloc(0);
    },
    ...options.clientOptions,
  });

  consumer.on("consumer:group:join", (p: { assignments?: { topic: string; partitions: number[] }[] }) => {
    if (stopping) return;
    const s = new KafkaSession(context, consumer, p.assignments ?? []);
    session = s;
    s.start().catch((err: unknown) => {
      // Could not read the committed offsets: rejoin, which starts the generation again.
      onError(errorOf(err));
      if (session === s) rejoin(500);
    });
  });
  let rejoinTimer: NodeJS.Timeout | undefined;
  const rejoin = (delayMs: number) => {
    if (stopping || rejoinTimer) return;
    rejoinTimer = setTimeout(() => {
      rejoinTimer = undefined;
      if (stopping) return;
      consumer.joinGroup({}).catch((err: unknown) => {
        onError(errorOf(err));
        rejoin(Math.min(5_000, delayMs * 2));
      });
    }, delayMs);
  };
  // A rejoin the client gave up on (the coordinator away): try again until it works or we stop.
  consumer.on("error", (err: Error) => {
    onError(err);
    if (!session) rejoin(500);
  });

  const crash = () => {
    // Like a killed process: nothing more applied or committed.
    if (stopping) return;
    stopping = true;
    session?.stop();
    session = undefined;
    clearTimeout(rejoinTimer);
    consumer
      .close(true)
      .catch(() => {})
      .finally(() => resolveClosed());
  };

  for (const t of topics) consumer.topics.track(t);
  try {
    await consumer.joinGroup({});
  } catch (err) {
    stopping = true;
    await consumer.close(true).catch(() => {});
    throw kafkaUnavailable(err)
      ? new BrokerUnavailableError(
          `cannot join group ${options.groupId} on Kafka at ${kafkaBrokers(options.brokers).join(",")}: ${errorOf(err).message}`,
          { cause: err },
        )
      : err;
  }

  return {
    stats,
    closed,
    async stop() {
      if (stopping) return closed;
      stopping = true;
      clearTimeout(rejoinTimer);
      const s = session;
      if (s) {
        s.stop();
        await s.inFlight.drained();
        await s.commit();
      }
      session = undefined;
      await consumer.close(true).catch((err: unknown) => onError(errorOf(err)));
      resolveClosed();
    },
  };
}
