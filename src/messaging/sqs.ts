/**
 * Amazon SQS through `@aws-sdk/client-sqs`: a publisher for the relay (batches of ten, the event id in
 * an `idem-id` message attribute; on a FIFO queue the aggregate id as `MessageGroupId` and the event id
 * as `MessageDeduplicationId`) and an inbox consumer (sqs-consumer.ts).
 *
 * SQS acknowledges a send once the message is stored redundantly; a batch answers message by message.
 * A FIFO queue drops a copy with the same deduplication id within five minutes; a standard queue keeps
 * it, and the consumer's inbox drops it.
 */
import type { MessageAttributeValue, SendMessageBatchRequestEntry, SQSClient } from "@aws-sdk/client-sqs";
import {
  HEADERS_ATTRIBUTE,
  queueUrls,
  type SqsConnection,
  sqsClient,
  sqsLibrary,
  sqsUnavailable,
} from "./sqs-client.ts";
import {
  BrokerUnavailableError,
  errorOf,
  MESSAGE_ID_HEADER,
  type OutboxMessage,
  type Publisher,
  type PublishOutcome,
  wireHeaders,
} from "./types.ts";

export type { SqsConnection } from "./sqs-client.ts";
export { consumeSqs, type SqsConsumerOptions, type SqsDelivery } from "./sqs-consumer.ts";

function attributesOf(m: OutboxMessage): Record<string, MessageAttributeValue> {
  const headers = wireHeaders(m);
  const out: Record<string, MessageAttributeValue> = {
    [MESSAGE_ID_HEADER]: { DataType: "String", StringValue: m.id },
  };
  const names = Object.keys(headers);
  if (names.length > 9) {
    out[HEADERS_ATTRIBUTE] = { DataType: "String", StringValue: JSON.stringify(headers) };
  } else {
    for (const k of names) out[k] = { DataType: "String", StringValue: headers[k]! };
  }
  return out;
}

/** Options of {@link SqsPublisher}. */
export interface SqsPublisherOptions extends SqsConnection {
  /**
   * The queue of a message: a queue URL, or a name looked up once with `GetQueueUrl`. Default: the
   * message's topic, as a queue name.
   */
  queue?: (m: OutboxMessage) => string;
  /** On a FIFO queue (`.fifo`), the message group. Default: the aggregate id, else the event id. */
  groupId?: (m: OutboxMessage) => string;
}

interface Waiting {
  m: OutboxMessage;
  resolve: (o: PublishOutcome) => void;
}

/**
 * Publishes outbox events to SQS queues with `SendMessageBatch`. Messages published in the same turn
 * of the event loop (an ordered relay's chains, one message per aggregate) share batches of ten.
 * `keepsOrder` is not claimed (batches go out side by side), so an ordered relay sends each
 * aggregate's next event once the previous one is stored, which a FIFO queue then keeps in order.
 */
export class SqsPublisher implements Publisher {
  /** Always `"sqs"`: the publisher's name in logs and metrics. */
  readonly name = "sqs";
  readonly #options: SqsPublisherOptions;
  #client: Promise<{ client: SQSClient; owned: boolean }> | undefined;
  readonly #urls: (queue: string) => Promise<string>;
  #waiting: Waiting[] = [];

  constructor(options: SqsPublisherOptions = {}) {
    this.#options = options;
    this.#urls = queueUrls(async () => (await this.#get()).client);
  }

  #get() {
    this.#client ??= sqsClient(this.#options);
    return this.#client;
  }

  /** Publish `messages`; one outcome per message, as SQS answered each. */
  publish(messages: readonly OutboxMessage[]): Promise<PublishOutcome[]> {
    const outcomes = messages.map(
      (m) =>
        new Promise<PublishOutcome>((resolve) => {
          this.#waiting.push({ m, resolve });
        }),
    );
    if (this.#waiting.length === messages.length) setImmediate(() => void this.#flush());
    return Promise.all(outcomes).then((all) => {
      // SQS could not be reached for any of them: say so for the whole call (the relay backs off).
      const first = all[0];
      if (first && !first.ok && all.every((o) => !o.ok && o.error instanceof BrokerUnavailableError)) {
        throw first.error;
      }
      return all;
    });
  }

  async #flush(): Promise<void> {
    const waiting = this.#waiting;
    this.#waiting = [];
    const byQueue = new Map<string, Waiting[]>();
    for (const w of waiting) {
      const q = this.#options.queue?.(w.m) ?? w.m.topic;
      byQueue.set(q, [...(byQueue.get(q) ?? []), w]);
    }
    await Promise.all(
      [...byQueue].map(async ([queue, ws]) => {
        let url: string;
        try {
          url = await this.#urls(queue);
        } catch (err) {
          const error = sqsUnavailable(err)
            ? new BrokerUnavailableError(`SQS unavailable: ${errorOf(err).message}`, { cause: err })
            : new Error(`queue ${queue}: ${errorOf(err).message}`, { cause: err });
          for (const w of ws) w.resolve({ ok: false, error });
          return;
        }
        const chunks: Waiting[][] = [];
        for (let i = 0; i < ws.length; i += 10) chunks.push(ws.slice(i, i + 10));
        await Promise.all(chunks.map((c) => this.#send(url, c)));
      }),
    );
  }

  async #send(url: string, ws: Waiting[]): Promise<void> {
    const fifo = url.endsWith(".fifo");
    const entries: SendMessageBatchRequestEntry[] = ws.map(({ m }, i) => ({
      Id: String(i),
      MessageBody: m.body,
      MessageAttributes: attributesOf(m),
      ...(fifo
        ? {
            MessageGroupId: this.#options.groupId?.(m) ?? m.aggregateId ?? m.id,
            MessageDeduplicationId: m.id,
          }
        : {}),
    }));
    try {
      const lib = await sqsLibrary();
      const { client } = await this.#get();
      const out = await client.send(new lib.SendMessageBatchCommand({ QueueUrl: url, Entries: entries }));
      const failed = new Map((out.Failed ?? []).map((f) => [f.Id, f]));
      ws.forEach((w, i) => {
        const f = failed.get(String(i));
        if (!f) {
          w.resolve({ ok: true });
          return;
        }
        const text = `SQS refused the message: ${f.Code}${f.Message ? ` (${f.Message})` : ""}`;
        w.resolve({ ok: false, error: f.SenderFault ? new Error(text) : new BrokerUnavailableError(text) });
      });
    } catch (err) {
      const error = sqsUnavailable(err)
        ? new BrokerUnavailableError(`SQS unavailable: ${errorOf(err).message}`, { cause: err })
        : errorOf(err);
      for (const w of ws) w.resolve({ ok: false, error });
    }
  }

  /** Destroy the client, when the publisher made it. */
  async close(): Promise<void> {
    const c = await this.#client?.catch(() => undefined);
    this.#client = undefined;
    if (c?.owned) c.client.destroy();
  }
}
