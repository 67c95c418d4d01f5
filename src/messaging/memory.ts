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
  /** Called once a consumer is done with it (acked, or parked by its inbox). */
  done?: () => void;
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

/** Options of {@link MemoryBroker}. */
export interface MemoryBrokerOptions {
  /**
   * Confirm a publish only when a consumer is done with the message (its effect committed), rather than
   * when it is queued. The relay then marks an outbox row published only after its effect, so a process
   * that dies with messages still queued loses nothing: the relay publishes them again after a restart.
   * Default false.
   */
  confirmOnConsume?: boolean;
  /** With `confirmOnConsume`: a message not consumed within this fails its publish. Default 10,000 ms. */
  confirmTimeoutMs?: number;
}

/** An in-process broker (see the module's notes): for the embedded default and tests, not production. */
export class MemoryBroker {
  readonly #queues = new Map<string, Queue>();
  readonly #options: MemoryBrokerOptions;

  constructor(options: MemoryBrokerOptions = {}) {
    this.#options = options;
  }

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

  /** A publisher for the relay: a message is confirmed once queued (or consumed, see the options). */
  publisher(): Publisher {
    const onConsume = this.#options.confirmOnConsume ?? false;
    const timeoutMs = this.#options.confirmTimeoutMs ?? 10_000;
    return {
      name: "memory",
      keepsOrder: true,
      publish: async (messages: readonly OutboxMessage[]): Promise<PublishOutcome[]> =>
        Promise.all(
          messages.map((m): Promise<PublishOutcome> => {
            const delivery: Delivery = {
              id: m.id,
              topic: m.topic,
              type: m.type,
              body: m.body,
              headers: wireHeaders(m),
              redelivered: false,
            };
            if (!onConsume) {
              this.#queue(m.topic).push({ delivery });
              return Promise.resolve({ ok: true });
            }
            return new Promise((resolve) => {
              const timer = setTimeout(
                () => resolve({ ok: false, error: new Error(`not consumed within ${timeoutMs} ms`) }),
                timeoutMs,
              );
              timer.unref();
              this.#queue(m.topic).push({
                delivery,
                done: () => {
                  clearTimeout(timer);
                  resolve({ ok: true });
                },
              });
            });
          }),
        ),
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
    const requeue = (q: Queued) => queue.push({ ...q, delivery: { ...q.delivery, redelivered: true } });
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
              return;
            }
            // ack and done-failed: the message leaves the queue
            q.done?.();
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
