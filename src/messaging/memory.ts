/**
 * An in-process broker with at-least-once delivery, for the embedded default (`npm start` without a
 * broker) and for tests. One queue per topic; consumers of a topic compete for its messages. A message
 * leaves its queue only when acked: a failed attempt is redelivered after `retryDelayMs`, and messages
 * in hand when a consumer stops or crashes go back to the queue, flagged as redelivered.
 *
 * It keeps nothing on disk: messages published and not yet consumed are lost with the process. The
 * outbox is the durable part; a restarted relay republishes whatever it had not marked published, but
 * anything already marked and still queued here is gone. Use a real broker for anything that matters.
 */
import { type ConsumerOptions, InFlight, newStats, type RunningConsumer, Settler } from "./consumer.ts";
import type { Delivery, OutboxMessage, Publisher, PublishOutcome } from "./types.ts";
import { wireHeaders } from "./types.ts";

interface Queued {
  delivery: Delivery;
}

interface Subscriber {
  capacity: number;
  deliver(q: Queued): void;
}

class Queue {
  readonly items: Queued[] = [];
  readonly subscribers: Subscriber[] = [];
  #next = 0;

  push(q: Queued): void {
    this.items.push(q);
    this.dispatch();
  }

  dispatch(): void {
    while (this.items.length > 0 && this.subscribers.length > 0) {
      let chosen: Subscriber | undefined;
      for (let i = 0; i < this.subscribers.length; i++) {
        const s = this.subscribers[(this.#next + i) % this.subscribers.length]!;
        if (s.capacity > 0) {
          chosen = s;
          this.#next = (this.#next + i + 1) % this.subscribers.length;
          break;
        }
      }
      if (!chosen) return;
      chosen.capacity--;
      chosen.deliver(this.items.shift()!);
    }
  }
}

export class MemoryBroker {
  readonly #queues = new Map<string, Queue>();

  #queue(topic: string): Queue {
    const found = this.#queues.get(topic);
    if (found) return found;
    const q = new Queue();
    this.#queues.set(topic, q);
    return q;
  }

  /** Messages waiting in `topic`'s queue (not counting those in a consumer's hands). */
  depth(topic: string): number {
    return this.#queues.get(topic)?.items.length ?? 0;
  }

  /** Put a message on a topic's queue (what the publisher does for each event). */
  send(topic: string, delivery: Omit<Delivery, "topic" | "redelivered">): void {
    this.#queue(topic).push({ delivery: { ...delivery, topic, redelivered: false } });
  }

  /** A publisher for the relay: every message is "confirmed" once queued. */
  publisher(): Publisher {
    return {
      name: "memory",
      publish: async (messages: readonly OutboxMessage[]): Promise<PublishOutcome[]> =>
        messages.map((m) => {
          this.send(m.topic, { id: m.id, type: m.type, body: m.body, headers: wireHeaders(m) });
          return { ok: true };
        }),
      close: async () => {},
    };
  }

  /** Consume `topic` through the inbox until `stop()`. */
  consume(topic: string, options: ConsumerOptions): RunningConsumer {
    const queue = this.#queue(topic);
    const stats = newStats();
    const settler = new Settler(options, stats);
    const inFlight = new InFlight();
    const retryDelayMs = options.retryDelayMs ?? 1_000;
    const timers = new Map<NodeJS.Timeout, Queued>(); // failed attempts waiting to be redelivered
    let open = true;
    let resolveClosed!: () => void;
    const closed = new Promise<void>((r) => {
      resolveClosed = r;
    });
    const requeue = (q: Queued) => queue.push({ delivery: { ...q.delivery, redelivered: true } });
    const sub: Subscriber = {
      capacity: Math.max(1, options.prefetch ?? 256),
      deliver(q) {
        inFlight.enter();
        settler
          .settle(q.delivery)
          .then((verdict) => {
            if (verdict === "crash") {
              requeue(q); // never acked: the broker redelivers it
              die();
              return;
            }
            if (verdict === "retry") {
              if (!open) return requeue(q);
              const t = setTimeout(() => {
                timers.delete(t);
                requeue(q);
              }, retryDelayMs);
              timers.set(t, q);
            }
            // ack and done-failed: the message leaves the queue
          })
          .finally(() => {
            sub.capacity++;
            inFlight.leave();
            if (open) queue.dispatch();
          });
      },
    };
    const detach = () => {
      open = false;
      const i = queue.subscribers.indexOf(sub);
      if (i >= 0) queue.subscribers.splice(i, 1);
    };
    const flushRetries = () => {
      for (const [t, q] of timers) {
        clearTimeout(t);
        requeue(q); // back to the queue now rather than lost with this consumer
      }
      timers.clear();
    };
    const die = () => {
      if (!open) return;
      detach();
      flushRetries();
      resolveClosed();
    };
    queue.subscribers.push(sub);
    queue.dispatch();
    return {
      stats,
      closed,
      async stop() {
        detach();
        await inFlight.drained();
        flushRetries();
        resolveClosed();
      },
    };
  }
}
