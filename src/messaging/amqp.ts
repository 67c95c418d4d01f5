/**
 * RabbitMQ (AMQP 0-9-1) through `amqplib`: a publisher for the relay (confirm channel, the event id as
 * `messageId`, `mandatory` so that an unroutable message is a failure rather than silently dropped) and
 * an inbox consumer (manual acks, prefetch, ack only after the effect committed).
 *
 * Reconnection is handled here rather than with amqplib's recovering connection: the publisher must know
 * exactly which messages of a batch were confirmed before a connection died (the rest fail and are
 * published again), and the consumer must ack each message on the channel it came from, never on a
 * replacement. Both are a few lines once the connection is ours.
 */

import type { Channel, ChannelModel, ConfirmChannel, ConsumeMessage, Options, SocketOptions } from "amqplib";
import { redactUrl } from "../core/redact.ts";
import { type ConsumerOptions, InFlight, newStats, type RunningConsumer, Settler } from "./consumer.ts";
import {
  BrokerUnavailableError,
  type Delivery,
  errorOf,
  HEADERS,
  MissingMessageIdError,
  type OutboxMessage,
  type Publisher,
  type PublishOutcome,
  wireHeaders,
} from "./types.ts";

async function amqpConnect(url: string, socketOptions: SocketOptions | undefined): Promise<ChannelModel> {
  let amqp: typeof import("amqplib");
  try {
    amqp = await import("amqplib");
  } catch (err) {
    throw new Error("idem/messaging/amqp needs amqplib: npm install amqplib", { cause: err });
  }
  try {
    return await amqp.connect(url, { timeout: 5_000, ...socketOptions });
  } catch (err) {
    throw new BrokerUnavailableError(
      `cannot connect to RabbitMQ at ${redactUrl(url)}: ${errorOf(err).message}`,
      {
        cause: err,
      },
    );
  }
}

/** Options of {@link AmqpPublisher}. Only `url` is required. */
export interface AmqpPublisherOptions {
  /** `amqp://user:pass@host:5672/vhost`. */
  url: string;
  /**
   * The exchange messages are published to, with the event's topic as routing key. Default `""` (the
   * default exchange: the topic is the name of the queue).
   */
  exchange?: string;
  /** The routing key of a message. Default: its topic. */
  routingKey?: (m: OutboxMessage) => string;
  /** Declare the topology (exchanges, queues, bindings) on each new connection. Default: nothing. */
  setup?: (channel: Channel) => Promise<void>;
  /** Persistent (delivery mode 2) messages. Default true. */
  persistent?: boolean;
  /**
   * How long to wait for the broker's confirms of one batch. Past it the connection is dropped and the
   * unconfirmed messages are put back (no attempt counted), to go out again on a new one. Default 10,000 ms.
   */
  confirmTimeoutMs?: number;
  /** Passed to `amqplib.connect`. Default `{ timeout: 5000 }`. */
  socketOptions?: SocketOptions;
}

interface Link {
  model: ChannelModel;
  channel: ConfirmChannel;
  /** Message ids the broker returned as unroutable (a return always precedes its confirm). */
  returned: Set<string>;
  /**
   * What waits on this connection (a confirm, a full socket buffer), told when it dies. Each waiter
   * removes itself once served, so the set holds what is in flight, never a trace of what was.
   */
  waiters: Set<(err: Error) => void>;
  dead: boolean;
  /** Drop the connection, telling every waiter why. */
  kill(err: Error): void;
}

/**
 * A channel closed by the broker with a reply code (406 PRECONDITION_FAILED, 404 NOT_FOUND...) refused
 * what it was sent: the messages' fault, counted as failed attempts. Anything else that ends a
 * connection (a reset socket, a missed heartbeat, a broker shutting down) is the broker's state: the
 * messages in flight are put back without an attempt.
 */
function lostConnection(err: Error, channelRefused: boolean): Error {
  if (channelRefused && typeof (err as { code?: unknown }).code === "number") return err;
  return new BrokerUnavailableError(`RabbitMQ connection lost: ${err.message}`, { cause: err });
}

/** Publishes outbox batches to RabbitMQ with publisher confirms. */
export class AmqpPublisher implements Publisher {
  /** Always `"amqp"`: the publisher's name in logs and metrics. */
  readonly name = "amqp";
  /** One confirm channel (one connection) carries a call's messages in order. */
  readonly keepsOrder = true;
  readonly #options: AmqpPublisherOptions;
  #link: Promise<Link> | undefined;

  constructor(options: AmqpPublisherOptions) {
    this.#options = options;
  }

  async #open(): Promise<Link> {
    const model = await amqpConnect(this.#options.url, this.#options.socketOptions);
    let channel: ConfirmChannel;
    try {
      channel = await model.createConfirmChannel();
      await this.#options.setup?.(channel);
    } catch (err) {
      await model.close().catch(() => {});
      throw err;
    }
    const die = (err: Error) => {
      if (link.dead) return;
      link.dead = true;
      for (const w of [...link.waiters]) w(err);
      link.waiters.clear();
      model.close().catch(() => {});
    };
    const link: Link = { model, channel, returned: new Set(), waiters: new Set(), dead: false, kill: die };
    model.on("error", (err: Error) => die(lostConnection(err, false)));
    model.on("close", () => die(lostConnection(new Error("connection closed"), false)));
    channel.on("error", (err: Error) => die(lostConnection(err, true)));
    channel.on("close", () => die(lostConnection(new Error("channel closed"), false)));
    channel.on("return", (msg: { properties: { messageId?: string } }) => {
      if (msg.properties.messageId) link.returned.add(String(msg.properties.messageId));
    });
    return link;
  }

  /** The live connection, opened on first use and again after it died. */
  async #get(): Promise<Link> {
    for (;;) {
      if (!this.#link) {
        const p = this.#open();
        this.#link = p;
        p.catch(() => {
          if (this.#link === p) this.#link = undefined;
        });
      }
      const p = this.#link;
      const link = await p;
      if (!link.dead) return link;
      if (this.#link === p) this.#link = undefined;
    }
  }

  /** Publish a batch on a confirm channel; one outcome per message, as the broker confirms each. */
  async publish(messages: readonly OutboxMessage[]): Promise<PublishOutcome[]> {
    const link = await this.#get();
    const { channel } = link;
    const exchange = this.#options.exchange ?? "";
    const persistent = this.#options.persistent ?? true;
    const routingKey = this.#options.routingKey ?? ((m: OutboxMessage) => m.topic);
    const outcomes: Promise<PublishOutcome>[] = [];
    for (const m of messages) {
      if (link.dead) {
        const error = new BrokerUnavailableError("RabbitMQ connection lost mid-batch");
        outcomes.push(Promise.resolve({ ok: false, error }));
        continue;
      }
      const options: Options.Publish = {
        messageId: m.id,
        type: m.type,
        contentType: "application/json",
        timestamp: Math.floor(m.createdAt.getTime() / 1000),
        persistent,
        mandatory: true,
        headers: wireHeaders(m),
      };
      let sent = true;
      // Until confirmed, a message is only as safe as the connection carrying it.
      outcomes.push(
        new Promise<PublishOutcome>((resolve) => {
          const lost = (error: Error) => resolve({ ok: false, error });
          link.waiters.add(lost);
          const settle = (o: PublishOutcome) => {
            link.waiters.delete(lost);
            resolve(o);
          };
          try {
            sent = channel.publish(exchange, routingKey(m), Buffer.from(m.body), options, (err: unknown) => {
              if (err) settle({ ok: false, error: errorOf(err) });
              else if (link.returned.delete(m.id)) {
                settle({ ok: false, error: new Error(`unroutable: no queue bound for "${routingKey(m)}"`) });
              } else settle({ ok: true });
            });
          } catch (err) {
            settle({ ok: false, error: errorOf(err) });
          }
        }),
      );
      if (!sent && !link.dead) {
        // The socket's buffer is full: wait for it to drain (or for the connection to die).
        await new Promise<void>((resolve) => {
          const done = () => {
            channel.off("drain", done);
            link.waiters.delete(done);
            resolve();
          };
          channel.once("drain", done);
          link.waiters.add(done);
        });
      }
    }
    const timeoutMs = this.#options.confirmTimeoutMs ?? 10_000;
    const timer = setTimeout(() => {
      // Confirms stuck: drop the connection (what waits on it fails and goes out again on a new one).
      link.kill(new BrokerUnavailableError(`RabbitMQ sent no confirm within ${timeoutMs} ms`));
    }, timeoutMs);
    try {
      return await Promise.all(outcomes);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Close the channel and the connection. */
  async close(): Promise<void> {
    const link = this.#link;
    this.#link = undefined;
    if (!link) return;
    const l = await link.catch(() => undefined);
    if (l && !l.dead) {
      l.dead = true;
      await l.model.close().catch(() => {});
    }
  }
}

/** Options of {@link consumeAmqp}. */
export interface AmqpConsumerOptions extends ConsumerOptions {
  /** The broker, e.g. `amqp://127.0.0.1:5672`. */
  url: string;
  /** The queue to consume. */
  queue: string;
  /** Declare the topology on each new connection (e.g. `ch => ch.assertQueue(queue)`). Default: nothing. */
  setup?: (channel: Channel) => Promise<void>;
  /** Passed to `amqplib.connect`. */
  socketOptions?: SocketOptions;
}

function headersOf(msg: ConsumeMessage): Record<string, string> {
  const out: Record<string, string> = {};
  const h = msg.properties.headers ?? {};
  for (const k of Object.keys(h)) {
    const v = (h as Record<string, unknown>)[k];
    if (v !== undefined && v !== null) out[k] = Buffer.isBuffer(v) ? v.toString("utf8") : String(v);
  }
  return out;
}

/**
 * Consume a RabbitMQ queue through an inbox: each message's effect and its inbox mark commit together,
 * and the message is acked only after that commit. A failed attempt is requeued after `retryDelayMs`;
 * at the inbox's `maxAttempts` it is parked and acked. A message without `messageId` cannot be
 * deduplicated and is rejected without requeue (to the queue's dead-letter exchange, if it has one).
 * A lost connection is re-established with backoff; what was unacked is redelivered by the broker.
 */
export async function consumeAmqp(options: AmqpConsumerOptions): Promise<RunningConsumer> {
  const stats = newStats();
  const settler = new Settler(options, stats);
  const inFlight = new InFlight();
  const prefetch = Math.max(1, options.prefetch ?? 256);
  const retryDelayMs = options.retryDelayMs ?? 1_000;
  const onError = options.onError ?? (() => {});
  let stopping = false;
  let model: ChannelModel | undefined;
  let consumer: { channel: Channel; tag: string } | undefined;
  let reconnectTimer: NodeJS.Timeout | undefined;
  let failures = 0;
  /** Why the last connection attempt failed (the first one's is thrown, as the cause). */
  let lastFailure: Error | undefined;
  let resolveClosed!: () => void;
  const closed = new Promise<void>((r) => {
    resolveClosed = r;
  });

  const onMessage = (channel: Channel, msg: ConsumeMessage) => {
    const id = msg.properties.messageId;
    if (id === undefined || id === null || id === "") {
      stats.refused++;
      onError(new MissingMessageIdError(`message on ${options.queue} has no messageId: rejected`));
      safely(() => channel.nack(msg, false, false));
      return;
    }
    const headers = headersOf(msg);
    const delivery: Delivery = {
      id: String(id),
      topic: msg.fields.routingKey,
      type: String(msg.properties.type ?? headers[HEADERS.type] ?? ""),
      body: msg.content.toString("utf8"),
      headers,
      redelivered: msg.fields.redelivered,
    };
    inFlight.enter();
    settler
      .settle(delivery)
      .then(async (verdict) => {
        switch (verdict) {
          case "ack":
          case "done-failed":
            // On the channel the message came from: if it died meanwhile, the broker redelivers and
            // the inbox absorbs the copy.
            safely(() => channel.ack(msg));
            break;
          case "retry":
            if (!stopping) await new Promise((r) => setTimeout(r, retryDelayMs));
            safely(() => channel.nack(msg, false, true));
            break;
          case "crash":
            crash();
            break;
        }
      })
      .finally(() => inFlight.leave());
  };

  const connect = async (): Promise<void> => {
    reconnectTimer = undefined;
    if (stopping) return;
    try {
      const m = await amqpConnect(options.url, options.socketOptions);
      model = m;
      const channel = await m.createChannel();
      await options.setup?.(channel);
      await channel.prefetch(prefetch);
      const lost = (err?: Error) => {
        if (model !== m) return;
        model = undefined;
        consumer = undefined;
        m.close().catch(() => {});
        if (stopping) return;
        if (err) onError(err);
        schedule();
      };
      m.on("error", lost);
      m.on("close", lost);
      channel.on("error", lost);
      channel.on("close", () => lost(new Error("RabbitMQ channel closed")));
      const { consumerTag } = await channel.consume(
        options.queue,
        (msg) => {
          if (msg === null) return lost(new Error(`consumer of ${options.queue} cancelled by the broker`));
          onMessage(channel, msg);
        },
        { noAck: false },
      );
      consumer = { channel, tag: consumerTag };
      failures = 0;
      lastFailure = undefined;
    } catch (err) {
      lastFailure = errorOf(err);
      onError(lastFailure);
      const m = model;
      model = undefined;
      await m?.close().catch(() => {});
      schedule();
    }
  };
  const schedule = () => {
    if (stopping || reconnectTimer) return;
    failures++;
    reconnectTimer = setTimeout(connect, Math.min(5_000, 100 * 2 ** Math.min(failures, 6)));
  };
  const crash = () => {
    // Like a killed process: the connection goes without a word; everything unacked is redelivered.
    if (stopping) return;
    stopping = true;
    clearTimeout(reconnectTimer);
    const m = model;
    model = undefined;
    m?.close().catch(() => {});
    resolveClosed();
  };

  await connect();
  if (!model) {
    stopping = true;
    clearTimeout(reconnectTimer);
    const cause = lastFailure;
    // A queue that does not exist closes the channel with 404 NOT_FOUND: say how to declare it.
    const missing = (cause as { code?: unknown } | undefined)?.code === 404;
    throw new BrokerUnavailableError(
      `cannot consume ${options.queue} from RabbitMQ at ${redactUrl(options.url)}: ${cause?.message ?? "no channel"}` +
        (missing ? ` (declare the queue first, e.g. setup: (ch) => ch.assertQueue("${options.queue}"))` : ""),
      { cause },
    );
  }
  return {
    stats,
    closed,
    async stop() {
      if (stopping) return closed;
      stopping = true;
      clearTimeout(reconnectTimer);
      const c = consumer;
      if (c) await c.channel.cancel(c.tag).catch(() => {});
      await inFlight.drained();
      const m = model;
      model = undefined;
      await m?.close().catch(() => {});
      resolveClosed();
    },
  };
}

function safely(fn: () => void): void {
  try {
    fn();
  } catch {
    // The channel is gone: the broker redelivers whatever was not acked.
  }
}
