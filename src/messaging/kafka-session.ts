/**
 * One generation of a Kafka consumer group member's work (kafka-consumer.ts has the member and the
 * timeline): its partitions' positions, a fetch per partition leader, records through the inbox, and
 * offset commits up to the records done.
 */
import type { Consumer, KafkaRecord, RecordsBatch } from "@platformatic/kafka";
import { type ConsumerOptions, type ConsumerStats, InFlight, Settler, type Verdict } from "./consumer.ts";
import { kafkaUnavailable } from "./kafka-client.ts";
import { type Delivery, errorOf, HEADERS, MESSAGE_ID_HEADER, MissingMessageIdError } from "./types.ts";

/** A Kafka record as the inbox's handler gets it. */
export interface KafkaDelivery extends Delivery {
  /** The partition it was read from. */
  partition: number;
  /** Its offset in the partition (a decimal string). */
  offset: string;
  /** The record key (the aggregate id, from the relay), or null. */
  key: string | null;
}

/** What a generation takes from its member. */
export interface SessionContext {
  lib: typeof import("@platformatic/kafka");
  topics: string[];
  prefetch: number;
  maxWaitMs: number;
  fromBeginning: boolean;
  stats: ConsumerStats;
  common: ConsumerOptions;
  onError: (err: Error) => void;
  /** A test's crash point fired: the member dies. */
  crash: () => void;
  /** The member is stopping (then a last commit is made after the work drained). */
  stopping: () => boolean;
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

/** One generation's work: its partitions, fetch loops and settler. */
export class KafkaSession {
  active = true;
  readonly inFlight = new InFlight();
  readonly parts = new Map<string, PartitionState>();
  readonly settler: Settler;
  readonly #fetching = new Set<number>();
  #inHand = 0;
  #committing = false;
  #commitAgain = false;
  #refresh = false;
  #pumping = false;
  #commitScheduled = false;

  constructor(
    readonly ctx: SessionContext,
    readonly consumer: Consumer,
    assigned: { topic: string; partitions: number[] }[],
  ) {
    // A record's key keeps its order within its partition.
    this.settler = new Settler(ctx.common, ctx.stats, (d) => {
      const k = (d as KafkaDelivery).key;
      return k === null ? undefined : `${(d as KafkaDelivery).partition}\u0000${k}`;
    });
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
      timestamp: !this.ctx.fromBeginning
        ? this.ctx.lib.ListOffsetTimestamps.LATEST
        : this.ctx.lib.ListOffsetTimestamps.EARLIEST,
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

  /**
   * Start a fetch for each leader with no fetch in flight, while there is room: once per turn of the
   * event loop, however many records finished in it.
   */
  pump(): void {
    if (this.#pumping) return;
    this.#pumping = true;
    setImmediate(() => {
      this.#pumping = false;
      this.#fetchAll();
    });
  }

  #fetchAll(): void {
    if (!this.active || this.#inHand >= this.ctx.prefetch) return;
    this.consumer.metadata({ topics: this.ctx.topics, forceUpdate: this.#refresh }).then(
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
    this.consumer.fetch({ node, topics: request, maxWaitTime: this.ctx.maxWaitMs }).then(
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
    const outOfRange = this.ctx.lib.findErrorBy(error, "apiId", "OFFSET_OUT_OF_RANGE");
    if (!kafkaUnavailable(error)) this.ctx.onError(error);
    this.#refresh = true;
    const again = () => setTimeout(() => this.pump(), 250);
    if (!outOfRange || states.length === 0) return void again();
    // Records deleted by retention before this group read them: start from the oldest one left.
    this.ctx.onError(
      new Error(`offsets out of range on ${states.length} partition(s): starting at the earliest`),
    );
    this.consumer
      .listOffsets({
        topics: [...new Set(states.map((s) => s.topic))],
        timestamp: this.ctx.lib.ListOffsetTimestamps.EARLIEST,
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
      const records = batch.attributes & this.ctx.lib.IS_CONTROL ? [] : batch.records;
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
      this.ctx.stats.refused++;
      this.ctx.onError(
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
      // Kafka cannot tell a replayed record from a first one (the inbox can); retries set it.
      redelivered: false,
      partition: s.partition,
      offset: offset.toString(),
      key: text(r.key) ?? null,
    };
    this.#inHand++;
    this.inFlight.enter();
    this.settler
      .settle(delivery)
      .then((verdict: Verdict) => {
        if (verdict === "crash") return this.ctx.crash();
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
    // Once the records finished in this turn (a transaction's batch) are all marked done.
    if (this.#commitScheduled) return;
    this.#commitScheduled = true;
    setImmediate(() => {
      this.#commitScheduled = false;
      void this.commit();
    });
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
        if (!this.active && !this.ctx.stopping()) return;
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
            this.ctx.onError(new Error(`offset commit failed: ${errorOf(err).message}`, { cause: err }));
          return;
        }
      } while (this.#commitAgain);
    } finally {
      this.#committing = false;
    }
  }
}
