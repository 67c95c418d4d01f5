/**
 * NATS JetStream through `@nats-io/jetstream` and `@nats-io/transport-node`: a publisher for the relay
 * (the event id as `msgID`, so the stream itself drops a copy published again within its duplicate
 * window and says so in the ack) and an inbox consumer (durable pull consumer, explicit acks, ack only
 * after the effect committed).
 *
 * The NATS client reconnects by itself; a publish whose ack did not arrive (timeout, connection lost)
 * fails, and the relay publishes it again later with the same msgID.
 */
import type { JetStreamClient, JetStreamManager, JsMsg } from "@nats-io/jetstream";
import type { ConnectionOptions, NatsConnection } from "@nats-io/transport-node";
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

/** The header JetStream deduplicates on; `msgID` sets it. */
export const NATS_MSG_ID = "Nats-Msg-Id";

let loaded:
  | Promise<{
      transport: typeof import("@nats-io/transport-node");
      js: typeof import("@nats-io/jetstream");
    }>
  | undefined;

/**
 * The NATS libraries, imported once (an `import()` per publish costs a module resolution each time:
 * under a loader such as tsx, a round trip to its thread, which was most of the ordered relay's CPU).
 */
function libs() {
  loaded ??= Promise.all([import("@nats-io/transport-node"), import("@nats-io/jetstream")]).then(
    ([transport, js]) => ({ transport, js }),
    (err: unknown) => {
      loaded = undefined;
      throw new Error(
        "idem/messaging/nats needs @nats-io/jetstream and @nats-io/transport-node: npm install them",
        { cause: err },
      );
    },
  );
  return loaded;
}

/** Connect to NATS, failing fast (as {@link BrokerUnavailableError}) when no server answers. */
export async function connectNats(
  servers: string | string[],
  options: ConnectionOptions = {},
): Promise<NatsConnection> {
  const { transport } = await libs();
  try {
    // noAsyncTraces: otherwise every request (each JetStream publish is one) captures two stack traces
    // up front in case it fails, which was a tenth of the relay's CPU; a failure still says what failed.
    return await transport.connect({
      servers,
      timeout: 5_000,
      maxReconnectAttempts: -1,
      noAsyncTraces: true,
      ...options,
    });
  } catch (err) {
    throw new BrokerUnavailableError(`cannot connect to NATS at ${servers}: ${errorOf(err).message}`, {
      cause: err,
    });
  }
}

/** NATS errors that say the stream or the connection is away for now, not that the message is wrong. */
const UNAVAILABLE = new Set([
  "TimeoutError", // no ack in time: a stream leader died, or the connection is down and buffering
  "NoResponders", // nobody serves the subject at this moment: a stream between two leaders
  "JetStreamNotEnabled", // what the JetStream client makes of "no responders"
  "ClosedConnectionError",
  "DrainingConnectionError",
  "ConnectionError",
]);

/**
 * A failed JetStream publish as the relay should see it: while the stream or the connection is away
 * (a leader election, a reconnect) it is {@link BrokerUnavailableError}, put back without an attempt
 * and tried again soon; anything else (a message too large, a full stream) is the message's failure.
 */
function publishFailure(err: unknown): Error {
  const error = errorOf(err);
  for (let e: unknown = error; e instanceof Error; e = e.cause) {
    const status = e.name === "JetStreamApiError" ? (e as { status?: unknown }).status : undefined;
    if (UNAVAILABLE.has(e.name) || status === 503) {
      return new BrokerUnavailableError(`NATS JetStream unavailable: ${error.message}`, { cause: error });
    }
  }
  return error;
}

/** Options of {@link NatsPublisher}: a `servers` list to connect to, or a `connection` of yours. */
export interface NatsPublisherOptions {
  /** `nats://127.0.0.1:4222` or several. Ignored when `connection` is given. */
  servers?: string | string[];
  /**
   * An open connection to use (not closed by `close()`). Connect it with `noAsyncTraces: true` (as
   * `connectNats` does) for throughput: each publish is a request, and async traces cost two stack
   * captures per request.
   */
  connection?: NatsConnection;
  /** Connection options when connecting from `servers`. */
  connectOptions?: ConnectionOptions;
  /**
   * How long to wait for each message's ack. A publish without an ack in time is put back (no attempt
   * counted) and goes out again with the same `Nats-Msg-Id`, which the stream drops if the first copy
   * did arrive; so this can be short, and it bounds the wait when a stream's leader dies. Default 2,000 ms.
   */
  timeoutMs?: number;
  /** The subject of a message. Default: its topic. */
  subject?: (m: OutboxMessage) => string;
}

/** Publishes outbox batches to JetStream, all messages of a batch in flight at once. */
export class NatsPublisher implements Publisher {
  /** Always `"nats"`: the publisher's name in logs and metrics. */
  readonly name = "nats";
  /** One connection carries a call's messages to the stream in order (no client-side retries). */
  readonly keepsOrder = true;
  readonly #options: NatsPublisherOptions;
  #conn: Promise<{ nc: NatsConnection; js: JetStreamClient; owned: boolean }> | undefined;

  constructor(options: NatsPublisherOptions) {
    if (!options.servers && !options.connection)
      throw new TypeError("NatsPublisher needs servers or a connection");
    this.#options = options;
  }

  #get() {
    if (!this.#conn) {
      const p = (async () => {
        const { js } = await libs();
        const owned = !this.#options.connection;
        const nc =
          this.#options.connection ??
          (await connectNats(this.#options.servers!, this.#options.connectOptions));
        return { nc, js: js.jetstream(nc), owned };
      })();
      this.#conn = p;
      p.catch(() => {
        if (this.#conn === p) this.#conn = undefined;
      });
    }
    return this.#conn;
  }

  /** Publish a batch to JetStream with the event id as `Nats-Msg-Id`; one outcome per message. */
  async publish(messages: readonly OutboxMessage[]): Promise<PublishOutcome[]> {
    const { nc, js } = await this.#get();
    if (nc.isClosed()) {
      this.#conn = undefined;
      throw new BrokerUnavailableError("NATS connection closed");
    }
    const { transport } = await libs();
    const timeout = this.#options.timeoutMs ?? 2_000;
    const subject = this.#options.subject ?? ((m: OutboxMessage) => m.topic);
    const encoder = new TextEncoder();
    return Promise.all(
      messages.map(async (m): Promise<PublishOutcome> => {
        const h = transport.headers();
        const wire = wireHeaders(m);
        for (const k of Object.keys(wire)) h.set(k, wire[k]!);
        try {
          const ack = await js.publish(subject(m), encoder.encode(m.body), {
            msgID: m.id,
            headers: h,
            timeout,
          });
          return { ok: true, duplicate: ack.duplicate };
        } catch (err) {
          return { ok: false, error: publishFailure(err) };
        }
      }),
    );
  }

  /** Drain and close the connection, when the publisher opened it. */
  async close(): Promise<void> {
    const c = this.#conn;
    this.#conn = undefined;
    const conn = await c?.catch(() => undefined);
    if (conn?.owned) await conn.nc.drain().catch(() => {});
  }
}

/** Create (or update) a durable pull consumer with explicit acks. */
export async function ensureNatsConsumer(
  jsm: JetStreamManager,
  options: {
    stream: string;
    durable: string;
    filterSubject?: string;
    ackWaitMs?: number;
    maxAckPending?: number;
  },
): Promise<void> {
  const { js } = await libs();
  await jsm.consumers.add(options.stream, {
    durable_name: options.durable,
    ack_policy: js.AckPolicy.Explicit,
    deliver_policy: js.DeliverPolicy.All,
    ack_wait: (options.ackWaitMs ?? 30_000) * 1_000_000, // nanoseconds
    max_ack_pending: options.maxAckPending ?? 1_000,
    ...(options.filterSubject ? { filter_subject: options.filterSubject } : {}),
  });
}

/** Options of {@link consumeNats}. */
export interface NatsConsumerOptions extends ConsumerOptions {
  /** `nats://127.0.0.1:4222` or several. Ignored when `connection` is given. */
  servers?: string | string[];
  /** An open connection to use (not closed by `stop()`). */
  connection?: NatsConnection;
  /** Passed to `connect` with `servers`. */
  connectOptions?: ConnectionOptions;
  /** The JetStream stream the consumer reads. */
  stream: string;
  /** The durable consumer's name. */
  durable: string;
  /**
   * Create the durable consumer if missing (or update it) with these settings. Default: it must exist.
   * `ackWaitMs` is how long JetStream waits for an ack before redelivering (default 30,000 ms).
   */
  create?: { filterSubject?: string; ackWaitMs?: number; maxAckPending?: number };
  /**
   * How long each pull request lives on the server. The server's idle heartbeats come every half of it,
   * and two missed ones make the client pull again, so this bounds how long consuming stalls when the
   * consumer's leader dies in a cluster (the library's 30 s default stalled it 30-40 s). Default 5,000 ms.
   */
  pullExpiresMs?: number;
}

/**
 * Consume a JetStream durable consumer through an inbox. Each message's effect and its inbox mark
 * commit together, and the message is acked only after that commit. A failed attempt is `nak`ed with a
 * delay of `retryDelayMs`; at the inbox's `maxAttempts` it is parked and terminated (`term`). A message
 * without `Nats-Msg-Id` cannot be deduplicated and is terminated. Unacked messages (a crash, a lost
 * connection) are redelivered by JetStream after the consumer's ack wait.
 */
export async function consumeNats(options: NatsConsumerOptions): Promise<RunningConsumer> {
  const { js: jsLib } = await libs();
  const owned = !options.connection;
  const nc = options.connection ?? (await connectNats(options.servers ?? [], options.connectOptions));
  const prefetch = Math.max(1, options.prefetch ?? 256);
  const retryDelayMs = options.retryDelayMs ?? 1_000;
  const onError = options.onError ?? (() => {});
  const stats = newStats();
  const settler = new Settler(options, stats);
  const inFlight = new InFlight();
  const decoder = new TextDecoder();
  let stopping = false;
  let resolveClosed!: () => void;
  const closed = new Promise<void>((r) => {
    resolveClosed = r;
  });
  try {
    if (options.create) {
      await ensureNatsConsumer(await jsLib.jetstreamManager(nc), {
        stream: options.stream,
        durable: options.durable,
        maxAckPending: Math.max(prefetch * 2, options.create.maxAckPending ?? 1_000),
        ...options.create,
      });
    }
  } catch (err) {
    if (owned) await nc.close().catch(() => {});
    throw err;
  }
  const consumer = await jsLib.jetstream(nc).consumers.get(options.stream, options.durable);
  const messages = await consumer.consume({
    max_messages: prefetch,
    expires: options.pullExpiresMs ?? 5_000,
  });
  let slots = prefetch;
  let slotFreed: (() => void) | undefined;

  const crash = () => {
    // Like a killed process: stop pulling, ack nothing more, drop the connection.
    if (stopping) return;
    stopping = true;
    messages.stop();
    (owned ? nc.close() : Promise.resolve()).catch(() => {}).finally(resolveClosed);
  };

  const handle = async (msg: JsMsg) => {
    const id = msg.headers?.get(NATS_MSG_ID);
    if (!id) {
      stats.refused++;
      onError(new MissingMessageIdError(`message on ${msg.subject} has no ${NATS_MSG_ID}: terminated`));
      msg.term(); // (no reason text: servers before 2.10.4 ignore a TERM that carries one)
      return;
    }
    const headers: Record<string, string> = {};
    if (msg.headers) for (const [k, v] of msg.headers) headers[k] = v.join(", ");
    const delivery: Delivery = {
      id,
      topic: msg.subject,
      type: headers[HEADERS.type] ?? "",
      body: decoder.decode(msg.data),
      headers,
      redelivered: msg.redelivered,
    };
    const verdict = await settler.settle(delivery);
    if (stopping && verdict !== "crash") {
      // Stopping or crashed meanwhile: acks are still worth sending on a live connection.
      if (nc.isClosed()) return;
    }
    switch (verdict) {
      case "ack":
        msg.ack();
        break;
      case "retry":
        msg.nak(retryDelayMs);
        break;
      case "done-failed":
        msg.term(); // parked by the inbox
        break;
      case "crash":
        crash();
        break;
    }
  };

  const pump = (async () => {
    try {
      for await (const msg of messages) {
        if (stopping) break;
        while (slots === 0) await new Promise<void>((r) => (slotFreed = r));
        slots--;
        inFlight.enter();
        handle(msg)
          .catch((err) => onError(errorOf(err)))
          .finally(() => {
            slots++;
            inFlight.leave();
            const f = slotFreed;
            slotFreed = undefined;
            f?.();
          });
      }
    } catch (err) {
      if (!stopping) onError(errorOf(err));
    }
  })();

  return {
    stats,
    closed,
    async stop() {
      if (stopping) return closed;
      stopping = true;
      messages.stop();
      slotFreed?.();
      await pump;
      await inFlight.drained();
      if (owned) await nc.drain().catch(() => {});
      resolveClosed();
    },
  };
}
