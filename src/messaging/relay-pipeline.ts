/**
 * An ordered batch sent in one go (`RelayOptions.pipeline`): every event of the batch goes out in one
 * `publish` call, in id order, without waiting for an aggregate's previous event to be confirmed.
 *
 *   chains (default):  a1 ──confirm──▶ a2 ──confirm──▶ a3        one confirm round trip per event
 *   pipelined:         a1 a2 a3 ... ──confirms──▶                one round trip per batch
 *
 * This keeps each aggregate's order only because the publisher says it does (`Publisher.keepsOrder`):
 * the messages of one call reach the broker, and are stored, in the call's order (RabbitMQ: one channel
 * to one queue; JetStream: one connection to one stream). A connection cut then loses a suffix of the
 * call, never a message between two stored ones, and what is put back goes out again in order.
 *
 * It is opt-in for what it cannot undo: the broker refusing an event and storing a later one of the same aggregate
 * (a RabbitMQ nack, a queue full with `x-overflow: reject-publish`, a JetStream limit with
 * `discard: new`, a timeout of which only the earlier one was lost). The later one is already on its
 * way; it is counted as `reordered` (it may reach consumers before the earlier one's retry). Later
 * events of that aggregate that were refused as well are put back without an attempt, held behind the
 * first refused one, as with chains.
 */
import type { BatchEnd, BatchSink } from "./relay-batch.ts";
import {
  errorOf,
  isBrokerUnavailable,
  type OutboxMessage,
  type Publisher,
  type PublishOutcome,
} from "./types.ts";

/**
 * The relay's way to send a batch when `pipeline` is on (undefined when it is off), counting what
 * went out of order in `stats.reordered` and reporting it to `onError`. Throws a TypeError for a
 * publisher that does not keep order.
 */
export function pipelined(
  options: {
    orderByAggregate?: boolean;
    pipeline?: boolean;
    publisher: Publisher;
    onError?: (e: Error) => void;
  },
  stats: { reordered: number },
): ((batch: OutboxMessage[], sink: BatchSink) => Promise<BatchEnd>) | undefined {
  if (!options.orderByAggregate || !options.pipeline) return undefined;
  const { publisher } = options;
  if (!publisher.keepsOrder) {
    throw new TypeError(`pipeline needs a publisher that keeps order; ${publisher.name} does not`);
  }
  return async (batch, sink) => {
    const end = await publishPipelined(publisher, batch, sink);
    if (end.reordered.length > 0) {
      stats.reordered += end.reordered.length;
      options.onError?.(
        new Error(`${end.reordered.length} event(s) stored after an earlier one of theirs failed`),
      );
    }
    return end;
  };
}

/** What a pipelined batch adds to {@link BatchEnd}: ids stored after an earlier event of theirs failed. */
export interface PipelinedEnd extends BatchEnd {
  reordered: string[];
}

/** Publish `batch` (sorted by id) in one call, handing the outcomes to `sink`. */
export async function publishPipelined(
  publisher: Publisher,
  batch: OutboxMessage[],
  sink: BatchSink,
): Promise<PipelinedEnd> {
  const end: PipelinedEnd = { unsent: [], held: [], reordered: [] };
  if (sink.stopped()) {
    end.unsent = batch.map((m) => m.id);
    return end;
  }
  let outcomes: PublishOutcome[];
  try {
    outcomes = await publisher.publish(batch);
    if (outcomes.length !== batch.length) {
      throw new Error(`publisher ${publisher.name} answered ${outcomes.length} of ${batch.length}`);
    }
  } catch (err) {
    const error = errorOf(err);
    if (isBrokerUnavailable(error)) {
      end.unavailable = error;
      end.unsent = batch.map((m) => m.id);
      return end;
    }
    outcomes = batch.map(() => ({ ok: false, error }));
  }
  const broken = new Set<string>(); // aggregates with a failed event in this batch
  const messages: OutboxMessage[] = [];
  const answers: PublishOutcome[] = [];
  batch.forEach((m, i) => {
    const o = outcomes[i]!;
    const key = m.aggregateId === null ? undefined : `${m.aggregateType ?? ""}\u0000${m.aggregateId}`;
    if (key !== undefined && broken.has(key)) {
      if (!o.ok) {
        end.held.push(m.id);
        return;
      }
      end.reordered.push(m.id);
    } else if (key !== undefined && !o.ok) broken.add(key);
    messages.push(m);
    answers.push(o);
  });
  sink.answered(messages, answers);
  return end;
}
