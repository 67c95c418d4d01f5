/**
 * One claimed batch on its way to the broker (see relay.ts for the claim and the marks around it).
 *
 * Without ordering the batch goes out in one `publish` call. With `orderByAggregate` each aggregate's
 * events form a chain: its first event goes out at once, and each next one as soon as the broker
 * confirmed the one before it, in a `publish` call of its own. Different aggregates never wait for
 * each other (a wave of "the i-th event of every aggregate" would wait for its slowest confirm), and
 * an aggregate's event never goes out before its previous one is confirmed. Events without an
 * aggregate go out together at once.
 *
 *   A:  a1 ──confirm──▶ a2 ──confirm──▶ a3
 *   B:  b1 ────────confirm────────▶ b2          (a slow confirm of b1 holds back b2 only)
 *   -:  x1 x2
 *
 * An aggregate whose event failed sends nothing more from the batch: the rest of its chain is put back,
 * held behind the failed event. When the broker cannot be reached at all, nothing more is sent; what
 * was not sent is put back at once.
 */
import { tracePublish } from "./observe.ts";
import {
  type BrokerUnavailableError,
  errorOf,
  isBrokerUnavailable,
  type OutboxMessage,
  type Publisher,
  type PublishOutcome,
} from "./types.ts";

/** Where the outcomes go, as they arrive. */
export interface BatchSink {
  /** The broker answered these messages (confirmed, refused, or lost them one by one). */
  answered(messages: readonly OutboxMessage[], outcomes: readonly PublishOutcome[]): void;
  /** True once nothing more may be sent (a test's crash point fired). */
  stopped(): boolean;
}

/** How a batch ended, beyond the outcomes handed to the sink. */
export interface BatchEnd {
  /** Set when `publish` threw it: the broker could not be reached at all. */
  unavailable?: BrokerUnavailableError;
  /** Ids not sent because of `unavailable` (or a stop): to be put back at once. */
  unsent: string[];
  /** Ids not sent because an earlier event of their aggregate failed: put back, held behind it. */
  held: string[];
}

type Sent = { outcomes: PublishOutcome[] } | { unavailable: BrokerUnavailableError };

/** One `publish` call: a throw other than "unavailable", or a short answer, fails every message. */
async function send(publisher: Publisher, messages: OutboxMessage[]): Promise<Sent> {
  try {
    const outcomes = await tracePublish(publisher.name, messages, (sent) => publisher.publish(sent));
    if (outcomes.length !== messages.length) {
      throw new Error(`publisher ${publisher.name} answered ${outcomes.length} of ${messages.length}`);
    }
    return { outcomes };
  } catch (err) {
    const error = errorOf(err);
    if (isBrokerUnavailable(error)) return { unavailable: error };
    return { outcomes: messages.map(() => ({ ok: false, error })) };
  }
}

function aggregateKey(m: OutboxMessage): string {
  return `${m.aggregateType ?? ""}\u0000${m.aggregateId}`;
}

/** Publish `batch` (sorted by id), handing outcomes to `sink` as they come. */
export async function publishBatch(
  publisher: Publisher,
  batch: OutboxMessage[],
  ordered: boolean,
  sink: BatchSink,
): Promise<BatchEnd> {
  const end: BatchEnd = { unsent: [], held: [] };
  if (!ordered) {
    const r = await send(publisher, batch);
    if ("unavailable" in r) {
      end.unavailable = r.unavailable;
      end.unsent = batch.map((m) => m.id);
    } else sink.answered(batch, r.outcomes);
    return end;
  }
  const chains = new Map<string, OutboxMessage[]>();
  const free: OutboxMessage[] = [];
  for (const m of batch) {
    if (m.aggregateId === null) {
      free.push(m);
      continue;
    }
    const k = aggregateKey(m);
    const chain = chains.get(k);
    if (chain) chain.push(m);
    else chains.set(k, [m]);
  }
  const ids = (ms: readonly OutboxMessage[]) => ms.map((m) => m.id);
  const inFlight: Promise<void>[] = [];
  /** Send `messages` (or, for a chain, its event at `at`), then what may follow. */
  const go = async (messages: OutboxMessage[], chain?: OutboxMessage[], at = 0): Promise<void> => {
    if (end.unavailable || sink.stopped()) {
      end.unsent.push(...ids(chain ? chain.slice(at) : messages));
      return;
    }
    const r = await send(publisher, messages);
    if ("unavailable" in r) {
      end.unavailable ??= r.unavailable;
      end.unsent.push(...ids(chain ? chain.slice(at) : messages));
      return;
    }
    sink.answered(messages, r.outcomes);
    if (!chain || at + 1 >= chain.length) return;
    if (r.outcomes[0]!.ok) return go([chain[at + 1]!], chain, at + 1);
    end.held.push(...ids(chain.slice(at + 1)));
  };
  if (free.length > 0) inFlight.push(go(free));
  for (const chain of chains.values()) inFlight.push(go([chain[0]!], chain, 0));
  await Promise.all(inFlight);
  return end;
}

/**
 * Marks a batch's rows as outcomes come in: one `mark` at a time, the outcomes that arrive meanwhile
 * gathered into the next. `proceed()` is asked before each mark (false: a test's crash point fired;
 * nothing more is marked or sent). `settled()` waits for the last mark, throws the first error of one,
 * and resolves with the total of what the marks resolved with (the rows the broker lost).
 */
export function marker(
  mark: (messages: OutboxMessage[], outcomes: PublishOutcome[]) => Promise<number>,
  proceed: () => boolean,
) {
  const queue: { messages: readonly OutboxMessage[]; outcomes: readonly PublishOutcome[] }[] = [];
  let running: Promise<void> | undefined;
  let failure: { error: unknown } | undefined;
  let stopped = false;
  let lost = 0;
  const flush = () => {
    if (running || queue.length === 0 || failure || stopped) return;
    if (!proceed()) {
      stopped = true;
      return;
    }
    const group = queue.splice(0);
    running = mark(
      group.flatMap((g) => g.messages),
      group.flatMap((g) => g.outcomes),
    )
      .then(
        (n) => {
          lost += n;
        },
        (error: unknown) => {
          failure = { error };
        },
      )
      .finally(() => {
        running = undefined;
        flush();
      });
  };
  const sink: BatchSink = {
    answered(messages, outcomes) {
      queue.push({ messages, outcomes });
      flush();
    },
    stopped: () => stopped || failure !== undefined,
  };
  return {
    sink,
    async settled(): Promise<number> {
      while (running) await running;
      if (failure) throw failure.error;
      return lost;
    },
  };
}

/**
 * Wake-ups at chosen times (process clock): `at(t)` adds one, and `wake` is called at the earliest,
 * then at the next. Times are rounded up to 10 ms and kept once each, so a burst of failures sets few
 * timers; they only say when to look again, never too early (the database decides what is claimable).
 */
export class Alarms {
  readonly #wake: () => void;
  #times: number[] = [];
  #timer: NodeJS.Timeout | undefined;

  constructor(wake: () => void) {
    this.#wake = wake;
  }

  at(at: number): void {
    const t = Math.ceil(at / 10) * 10;
    let i = 0;
    while (i < this.#times.length && this.#times[i]! < t) i++;
    if (this.#times[i] === t) return;
    this.#times.splice(i, 0, t);
    if (i === 0) this.#arm();
  }

  clear(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#times = [];
  }

  #arm(): void {
    clearTimeout(this.#timer);
    const next = this.#times[0];
    if (next === undefined) return;
    this.#timer = setTimeout(
      () => {
        const now = Date.now();
        while (this.#times.length > 0 && this.#times[0]! <= now) this.#times.shift();
        this.#wake();
        this.#arm();
      },
      Math.max(0, next - Date.now()),
    );
    this.#timer.unref();
  }
}
