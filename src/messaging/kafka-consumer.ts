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
import type {
  ConsumerOptions as ClientOptions,
  Consumer,
  KafkaRecord,
  RecordsBatch,
} from "@platformatic/kafka";
import {
  type ConsumerOptions,
  type DeliveryConsumerOptions,
  InFlight,
  newStats,
  type RunningConsumer,
  Settler,
  type Verdict,
} from "./consumer.ts";
import { kafkaBrokers, kafkaLibrary, kafkaUnavailable } from "./kafka-client.ts";
import {
  BrokerUnavailableError,
  type Delivery,
  errorOf,
  HEADERS,
  MESSAGE_ID_HEADER,
  MissingMessageIdError,
} from "./types.ts";

/** A Kafka record as the inbox's handler gets it. */
export interface KafkaDelivery extends Delivery {
  /** The partition it was read from. */
  partition: number;
  /** Its offset in the partition (a decimal string). */
  offset: string;
  /** The record key (the aggregate id, from the relay), or null. */
  key: string | null;
}

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

interface PartitionState {
  topic: string;
  partition: number;
  /** The next offset to fetch. */
  next: bigint;
  /** Records in hand, in offset order: offset -> done. */
  pending: Map<bigint, boolean>;
  /** The last offset committed (the next record to read after a restart). */
  committed: bigint;
}

const partitionKey = (topic: string, partition: number) => `${topic}\u0000${partition}`;

function text(b: Buffer | string | null | undefined): string | undefined {
  if (b === null || b === undefined) return undefined;
  return typeof b === "string" ? b : b.toString("utf8");
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
  const prefetch = Math.max(1, options.prefetch ?? 1_000);
  const common = options as unknown as ConsumerOptions;
  let session: Session | undefined;
  let stopping = false;
  let resolveClosed!: () => void;
  const closed = new Promise<void>((r) => {
    resolveClosed = r;
  });

  /** One generation's work: its partitions, fetch loops and settler. */
  class Session {
    active = true;
    readonly inFlight = new InFlight();
    readonly parts = new Map<string, PartitionState>();
    readonly settler = new Settler(common, stats, (d) => {
      const k = (d as KafkaDelivery).key;
      return k === null ? undefined : `${(d as KafkaDelivery).partition}\u0000${k}`;
    });
    readonly #fetching = new Set<number>();
    #inHand = 0;
    #committing = false;
    #commitAgain = false;
    #refresh = false;

    constructor(
      readonly consumer: Consumer,
      assigned: { topic: string; partitions: number[] }[],
    ) {
      for (const a of assigned) {
        for (const p of a.partitions) {
          this.parts.set(partitionKey(a.topic, p), {
            topic: a.topic,
            partition: p,
            next: -1n,
            pending: new Map(),
            committed: -1n,
          });
        }
      }
    }

    async start(): Promise<void> {
      const assigned = [...this.parts.values()];
      if (assigned.length === 0) return;
      const byTopic = new Map<string, number[]>();
      for (const s of assigned) byTopic.set(s.topic, [...(byTopic.get(s.topic) ?? []), s.partition]);
      const committed = await this.consumer.listCommittedOffsets({
        topics: [...byTopic].map(([topic, partitions]) => ({ topic, partitions })),
      });
      const start = await this.consumer.listOffsets({
        topics: [...byTopic.keys()],
        partitions: Object.fromEntries(byTopic),
        timestamp:
          options.fromBeginning === false
            ? lib.ListOffsetTimestamps.LATEST
            : lib.ListOffsetTimestamps.EARLIEST,
      });
      for (const s of assigned) {
        const c = committed.get(s.topic)?.[s.partition] ?? -1n;
        s.committed = c;
        s.next = c >= 0n ? c : (start.get(s.topic)?.[s.partition] ?? 0n);
      }
      this.pump();
    }

    stop(): void {
      this.active = false;
      this.settler.drop();
    }

    /** Start a fetch for each leader with no fetch in flight, while there is room. */
    pump(): void {
      if (!this.active || this.#inHand >= prefetch) return;
      this.consumer.metadata({ topics, forceUpdate: this.#refresh }).then(
        (metadata) => {
          this.#refresh = false;
          if (!this.active) return;
          const byNode = new Map<number, PartitionState[]>();
          for (const s of this.parts.values()) {
            const t = metadata.topics.get(s.topic);
            const leader = t?.partitions[s.partition]?.leader;
            if (leader === undefined || leader < 0 || this.#fetching.has(leader)) continue;
            byNode.set(leader, [...(byNode.get(leader) ?? []), s]);
          }
          for (const [node, states] of byNode) this.#fetch(node, states, metadata.topics);
        },
        (err: unknown) => this.#failed(err),
      );
    }

    #fetch(node: number, states: PartitionState[], meta: Map<string, { id: string }>): void {
      this.#fetching.add(node);
      const byTopic = new Map<string, PartitionState[]>();
      for (const s of states) byTopic.set(s.topic, [...(byTopic.get(s.topic) ?? []), s]);
      const names = new Map<string, string>();
      const request = [...byTopic].map(([topic, ss]) => {
        const topicId = meta.get(topic)!.id;
        names.set(topicId, topic);
        return {
          topicId,
          partitions: ss.map((s) => ({
            partition: s.partition,
            fetchOffset: s.next,
            partitionMaxBytes: 1_048_576,
            currentLeaderEpoch: -1,
            lastFetchedEpoch: -1,
          })),
        };
      });
      this.consumer.fetch({ node, topics: request, maxWaitTime: options.maxWaitMs ?? 500 }).then(
        (response) => {
          this.#fetching.delete(node);
          if (!this.active) return;
          for (const tr of response.responses) {
            const topic = names.get(tr.topicId) ?? tr.topicId;
            for (const pr of tr.partitions) {
              const s = this.parts.get(partitionKey(topic, pr.partitionIndex));
              if (s) this.#take(s, pr.records ?? []);
            }
          }
          this.pump();
        },
        (err: unknown) => {
          this.#fetching.delete(node);
          this.#failed(err, states);
        },
      );
    }

    /** A fetch failed: reset what is out of range, refresh the leaders, try again shortly. */
    #failed(err: unknown, states: PartitionState[] = []): void {
      if (!this.active) return;
      const error = errorOf(err);
      const outOfRange = lib.findErrorBy(error, "apiId", "OFFSET_OUT_OF_RANGE");
      if (!kafkaUnavailable(error)) onError(error);
      this.#refresh = true;
      const again = () => setTimeout(() => this.pump(), 250);
      if (!outOfRange || states.length === 0) return void again();
      // Records deleted by retention before this group read them: start from the oldest one left.
      onError(new Error(`offsets out of range on ${states.length} partition(s): starting at the earliest`));
      this.consumer
        .listOffsets({
          topics: [...new Set(states.map((s) => s.topic))],
          timestamp: lib.ListOffsetTimestamps.EARLIEST,
        })
        .then((o) => {
          for (const s of states) if (s.pending.size === 0) s.next = o.get(s.topic)?.[s.partition] ?? s.next;
        })
        .catch(() => {})
        .finally(again);
    }

    #take(s: PartitionState, batches: RecordsBatch[]): void {
      for (const batch of batches) {
        const last = batch.firstOffset + BigInt(batch.lastOffsetDelta);
        if (last < s.next) continue;
        // Control batches (transaction markers) take an offset and carry no record.
        const records = batch.attributes & lib.IS_CONTROL ? [] : batch.records;
        for (const r of records) {
          const offset = batch.firstOffset + BigInt(r.offsetDelta);
          if (offset < s.next) continue;
          this.#deliver(s, offset, r);
        }
        s.next = last + 1n;
      }
    }

    #deliver(s: PartitionState, offset: bigint, r: KafkaRecord): void {
      const headers: Record<string, string> = {};
      for (const [k, v] of r.headers) if (k) headers[k.toString("utf8")] = text(v) ?? "";
      const id = headers[MESSAGE_ID_HEADER];
      s.pending.set(offset, false);
      if (!id) {
        stats.refused++;
        onError(
          new MissingMessageIdError(
            `record ${s.topic}/${s.partition}@${offset} has no ${MESSAGE_ID_HEADER} header: skipped`,
          ),
        );
        this.#done(s, offset);
        return;
      }
      const delivery: KafkaDelivery = {
        id,
        topic: s.topic,
        type: headers[HEADERS.type] ?? "",
        body: text(r.value) ?? "",
        headers,
        // Offsets past the committed one may have been applied by an earlier member or life.
        redelivered: offset < s.committed,
        partition: s.partition,
        offset: offset.toString(),
        key: text(r.key) ?? null,
      };
      this.#inHand++;
      this.inFlight.enter();
      this.settler
        .settle(delivery)
        .then((verdict: Verdict) => {
          if (verdict === "crash") return crash();
          if (verdict !== "dropped" && verdict !== "retry") this.#done(s, offset);
        })
        .finally(() => {
          this.#inHand--;
          this.inFlight.leave();
          this.pump();
        });
    }

    /** A record is done: move the partition's committable offset past every done record in front. */
    #done(s: PartitionState, offset: bigint): void {
      s.pending.set(offset, true);
      for (const [o, done] of s.pending) {
        if (!done) break;
        s.pending.delete(o);
      }
      void this.commit();
    }

    /** Commit each partition's offset up to its first record not done. One commit in flight at a time. */
    async commit(): Promise<void> {
      if (this.#committing) {
        this.#commitAgain = true;
        return;
      }
      this.#committing = true;
      try {
        do {
          this.#commitAgain = false;
          // After a revocation began nothing is committed (see the timeline): the new owner replays.
          if (!this.active && !stopping) return;
          const offsets: { topic: string; partition: number; offset: bigint; leaderEpoch: number }[] = [];
          for (const s of this.parts.values()) {
            const first = s.pending.keys().next();
            const upTo = first.done ? s.next : first.value;
            if (upTo > s.committed && upTo >= 0n) {
              offsets.push({ topic: s.topic, partition: s.partition, offset: upTo, leaderEpoch: -1 });
            }
          }
          if (offsets.length === 0) return;
          try {
            await this.consumer.commit({ offsets });
            for (const o of offsets) {
              const s = this.parts.get(partitionKey(o.topic, o.partition))!;
              if (o.offset > s.committed) s.committed = o.offset;
            }
          } catch (err) {
            if (this.active)
              onError(new Error(`offset commit failed: ${errorOf(err).message}`, { cause: err }));
            return;
          }
        } while (this.#commitAgain);
      } finally {
        this.#committing = false;
      }
    }
  }

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
    const s = new Session(consumer, p.assignments ?? []);
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
