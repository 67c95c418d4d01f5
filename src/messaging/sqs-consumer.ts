/**
 * An SQS queue consumed through an inbox (see sqs.ts for the publisher).
 *
 * Timeline of one message:
 *
 *   receive    long polling (`waitTimeSec`), up to ten at a time, by `pollers` loops while fewer than
 *              `prefetch` are in hand; the message is invisible to other consumers for
 *              `visibilityTimeoutSec`
 *   heartbeat  while it is in hand, its visibility is extended every third of that timeout, so slow
 *              work does not make it reappear to another consumer
 *   apply      effect and inbox mark in one PostgreSQL transaction (batched with the others in hand)
 *   delete     after the commit, in batches of ten (`DeleteMessageBatch`)
 *
 * A message whose visibility runs out anyway (a consumer killed, a stalled process, heartbeats off)
 * reappears, possibly to another consumer while the first still works on it: the inbox makes the
 * second one wait for the first's transaction and answers "duplicate". A failed attempt is made
 * visible again after `retryDelayMs` (so SQS counts the receive and a redrive policy moves it to the
 * dead-letter queue after its `maxReceiveCount`); at the inbox's `maxAttempts` it is parked and
 * deleted. On a FIFO queue the messages of one group are applied in order and a failing one is
 * retried in place while the group's later messages wait (other groups go on), then parked.
 */
import type { Message } from "@aws-sdk/client-sqs";
import {
  type ConsumerOptions,
  type DeliveryConsumerOptions,
  InFlight,
  newStats,
  type RunningConsumer,
  Settler,
  type Verdict,
} from "./consumer.ts";
import { HEADERS_ATTRIBUTE, queueUrls, type SqsConnection, sqsClient, sqsLibrary } from "./sqs-client.ts";
import { type Delivery, errorOf, HEADERS, MESSAGE_ID_HEADER, MissingMessageIdError } from "./types.ts";

/** An SQS message as the inbox's handler gets it. */
export interface SqsDelivery extends Delivery {
  /** How many times SQS has handed it out (`ApproximateReceiveCount`). */
  receiveCount: number;
  /** Its FIFO message group, or null on a standard queue. */
  groupId: string | null;
}

/** Options of {@link consumeSqs}. */
export interface SqsConsumerOptions extends DeliveryConsumerOptions<SqsDelivery>, SqsConnection {
  /** The queue: its URL, or its name (looked up once). A name or URL ending in `.fifo` is a FIFO queue. */
  queue: string;
  /** Messages in hand at once. Default 100. */
  prefetch?: number;
  /** Receive loops side by side (each long-polls for up to ten). Default: prefetch / 10, at most 10. */
  pollers?: number;
  /** How long a received message stays invisible to others (sent with each receive). Default 30 s. */
  visibilityTimeoutSec?: number;
  /** Extend the visibility of the messages in hand every third of `visibilityTimeoutSec`. Default true. */
  heartbeat?: boolean;
  /** Long polling: how long a receive waits for messages. Default 20 s. */
  waitTimeSec?: number;
}

function deliveryOf(m: Message, topic: string): SqsDelivery | undefined {
  const headers: Record<string, string> = {};
  for (const [k, v] of Object.entries(m.MessageAttributes ?? {})) {
    if (v.StringValue === undefined) continue;
    if (k === HEADERS_ATTRIBUTE) Object.assign(headers, JSON.parse(v.StringValue) as Record<string, string>);
    else headers[k] = v.StringValue;
  }
  const id = headers[MESSAGE_ID_HEADER];
  if (!id) return undefined;
  const receiveCount = Number(m.Attributes?.ApproximateReceiveCount ?? 1);
  return {
    id,
    topic,
    type: headers[HEADERS.type] ?? "",
    body: m.Body ?? "",
    headers,
    redelivered: receiveCount > 1,
    receiveCount,
    groupId: m.Attributes?.MessageGroupId ?? null,
  };
}

/**
 * Consume an SQS queue through an inbox: long polling, effect and mark in one transaction, batch
 * delete after the commit, the visibility extended while the work runs (see the timeline above). A
 * message without an `idem-id` attribute cannot be deduplicated: it is refused (left to reappear, and
 * to the dead-letter queue with a redrive policy) and counted in `stats.refused`.
 */
export async function consumeSqs(options: SqsConsumerOptions): Promise<RunningConsumer> {
  const lib = await sqsLibrary();
  const { client, owned } = await sqsClient(options);
  const url = await queueUrls(async () => client)(options.queue).catch(async (err: unknown) => {
    if (owned) client.destroy();
    throw err;
  });
  const fifo = url.endsWith(".fifo");
  const topic = options.queue.replace(/^.*\//, "");
  const stats = newStats();
  const settler = new Settler(
    options as unknown as ConsumerOptions,
    stats,
    fifo ? (d) => (d as SqsDelivery).groupId ?? undefined : undefined,
  );
  const inFlight = new InFlight();
  const onError = options.onError ?? (() => {});
  const prefetch = Math.max(1, options.prefetch ?? 100);
  const pollers = Math.max(1, options.pollers ?? Math.min(10, Math.ceil(prefetch / 10)));
  const visibility = Math.max(1, Math.round(options.visibilityTimeoutSec ?? 30));
  const retryDelaySec = Math.ceil((options.retryDelayMs ?? 1_000) / 1000);
  const abort = new AbortController();
  /** Receipt handles of the messages in hand (for the heartbeat). */
  const inHand = new Set<string>();
  let stopping = false;
  let crashed = false;
  const slotWaiters: (() => void)[] = [];
  const wakePollers = () => {
    for (const f of slotWaiters.splice(0)) f();
  };
  let resolveClosed!: () => void;
  const closed = new Promise<void>((r) => {
    resolveClosed = r;
  });

  const batched = (send: (entries: { Id: string; ReceiptHandle: string }[]) => Promise<void>) => {
    const pending: string[] = [];
    let flushing: Promise<void> = Promise.resolve();
    const flush = () => {
      const handles = pending.splice(0);
      const chunks: string[][] = [];
      for (let i = 0; i < handles.length; i += 10) chunks.push(handles.slice(i, i + 10));
      flushing = Promise.all(
        chunks.map((c) =>
          send(c.map((h, i) => ({ Id: String(i), ReceiptHandle: h }))).catch((err: unknown) =>
            onError(errorOf(err)),
          ),
        ),
      ).then(() => {});
      return flushing;
    };
    return {
      add(handle: string) {
        pending.push(handle);
        if (pending.length === 10) void flush();
        else if (pending.length === 1) setImmediate(() => void flush());
      },
      done: async () => {
        await flushing;
        await flush();
      },
    };
  };
  const deletes = batched(async (Entries) => {
    const out = await client.send(new lib.DeleteMessageBatchCommand({ QueueUrl: url, Entries }));
    // A handle that expired meanwhile (the message reappeared): its copy is absorbed by the inbox.
    for (const f of out.Failed ?? []) onError(new Error(`SQS delete failed: ${f.Code} ${f.Message ?? ""}`));
  });

  const heartbeat =
    options.heartbeat === false
      ? undefined
      : setInterval(
          () => {
            const handles = [...inHand];
            for (let i = 0; i < handles.length; i += 10) {
              const Entries = handles
                .slice(i, i + 10)
                .map((h, j) => ({ Id: String(j), ReceiptHandle: h, VisibilityTimeout: visibility }));
              client
                .send(new lib.ChangeMessageVisibilityBatchCommand({ QueueUrl: url, Entries }))
                .catch((err: unknown) => onError(errorOf(err)));
            }
          },
          Math.max(250, (visibility * 1000) / 3),
        );
  heartbeat?.unref();

  const settled = (m: Message, verdict: Verdict) => {
    const handle = m.ReceiptHandle!;
    inHand.delete(handle);
    if (crashed) return;
    switch (verdict) {
      case "ack":
      case "done-failed":
        deletes.add(handle);
        break;
      case "retry":
        // Visible again after the delay: SQS counts the next receive (redrive policies see it).
        client
          .send(
            new lib.ChangeMessageVisibilityCommand({
              QueueUrl: url,
              ReceiptHandle: handle,
              VisibilityTimeout: retryDelaySec,
            }),
          )
          .catch((err: unknown) => onError(errorOf(err)));
        break;
      case "crash":
        crash();
        break;
      case "dropped":
        break;
    }
  };

  const handle = (m: Message) => {
    const d = deliveryOf(m, topic);
    if (!d) {
      stats.refused++;
      onError(
        new MissingMessageIdError(`message ${m.MessageId} on ${topic} has no ${MESSAGE_ID_HEADER}: refused`),
      );
      return;
    }
    inHand.add(m.ReceiptHandle!);
    inFlight.enter();
    settler
      .settle(d)
      .then((v) => settled(m, v))
      .finally(() => {
        inFlight.leave();
        wakePollers();
      });
  };

  const poll = async () => {
    let failures = 0;
    while (!stopping) {
      while (inFlight.count >= prefetch && !stopping) await new Promise<void>((r) => slotWaiters.push(r));
      if (stopping) break;
      try {
        const out = await client.send(
          new lib.ReceiveMessageCommand({
            QueueUrl: url,
            MaxNumberOfMessages: Math.min(10, prefetch - inFlight.count),
            WaitTimeSeconds: options.waitTimeSec ?? 20,
            VisibilityTimeout: visibility,
            MessageSystemAttributeNames: ["ApproximateReceiveCount", "MessageGroupId"],
            MessageAttributeNames: ["All"],
          }),
          { abortSignal: abort.signal },
        );
        failures = 0;
        if (stopping) break; // not handled: they reappear after the visibility timeout
        for (const m of out.Messages ?? []) handle(m);
      } catch (err) {
        if (stopping) break;
        onError(errorOf(err));
        await new Promise((r) => setTimeout(r, Math.min(5_000, 100 * 2 ** Math.min(++failures, 6))));
      }
    }
  };
  const loops = Array.from({ length: pollers }, poll);

  const crash = () => {
    // Like a killed process: nothing more deleted, no more heartbeats; what is in hand reappears.
    if (stopping) return;
    crashed = true;
    stopping = true;
    abort.abort();
    clearInterval(heartbeat);
    settler.drop();
    if (owned) client.destroy();
    resolveClosed();
  };

  return {
    stats,
    closed,
    async stop() {
      if (stopping) return closed;
      stopping = true;
      abort.abort();
      wakePollers();
      await Promise.all(loops);
      settler.drop(); // retries waiting (FIFO): not deleted, they reappear
      await inFlight.drained();
      clearInterval(heartbeat);
      await deletes.done();
      if (owned) client.destroy();
      resolveClosed();
    },
  };
}
