/**
 * What the messaging benchmark's brokers share (bench/messaging.ts runs them): the broker's face to the
 * benchmark and the two ways to write a consumer's effect.
 */
import type { ConsumerOptions, RunningConsumer } from "../src/messaging/consumer.ts";
import type { Publisher } from "../src/messaging/types.ts";
import type { Db, Tx } from "../src/postgres/db.ts";

export type EffectStyle = "message" | "batch";

export interface Broker {
  name: string;
  /** The broker's process, as named in its command line (for CPU accounting). */
  process: string;
  topic: string;
  publisher(): Publisher;
  consume(
    db: Db,
    consumer: string,
    effect: EffectStyle | Pick<ConsumerOptions, "batchHandler" | "batchSize" | "concurrency">,
  ): Promise<RunningConsumer>;
  /** Drop whatever is left on the broker (between runs). */
  reset(): Promise<void>;
  cleanup(): Promise<void>;
}

/** The effect: one row per message, stamped with the commit-side clock. */
async function effect(tx: Tx, m: { id: string }): Promise<void> {
  await tx.query("INSERT INTO bench_effects (message_id) VALUES ($1)", [m.id]);
}

/** The same effect, set-based: one statement for a whole batch. */
async function effects(tx: Tx, ms: { id: string }[]): Promise<void> {
  await tx.query("INSERT INTO bench_effects (message_id) SELECT jsonb_array_elements_text($1::text::jsonb)", [
    JSON.stringify(ms.map((m) => m.id)),
  ]);
}

export const handlers = (style: Parameters<Broker["consume"]>[2]) =>
  typeof style === "object" ? style : style === "batch" ? { batchHandler: effects } : { handler: effect };
