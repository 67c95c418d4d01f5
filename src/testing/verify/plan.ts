/**
 * The seeded mix of faults: which intents are sent twice, sent concurrently, lose their reply, time
 * out, or are probed with a changed body or from a second account. The same seed and intent count
 * give the same plan.
 */
import { createRng, type Rng } from "../prng.ts";

/** How an intent of the plan is delivered (`verify`'s faults). */
export type VerifyDelivery = "duplicate" | "concurrent" | "drop" | "timeout";
/** A probe sent after an intent's answer, with the same key. */
export type VerifyProbe = "mismatch" | "scope";
/** One of the faults `verify` can enable: a delivery or a probe. */
export type VerifyFault = VerifyDelivery | VerifyProbe;

/** Ways an intent's request is delivered. */
export const DELIVERIES: readonly VerifyDelivery[] = ["duplicate", "concurrent", "drop", "timeout"];
/** Probes sent after an intent's answer, with the same key. */
export const PROBES: readonly VerifyProbe[] = ["mismatch", "scope"];
export const FAULTS: readonly VerifyFault[] = [...DELIVERIES, ...PROBES];

export interface IntentPlan {
  n: number;
  /**
   * `once`: sent once (only when no delivery fault is enabled). `duplicate`: sent, then sent again
   * with the same key. `concurrent`: `copies` sends at the same moment. `drop`: the first reply is
   * dropped by the proxy after the server answered, the client retries. `timeout`: the first reply
   * is held until the client's per-try timeout fires, the client retries.
   */
  delivery: VerifyDelivery | "once";
  /** Same key, changed body: expects 422 and no effect. */
  mismatch: boolean;
  /** Same key from a second account: expects a fresh answer of its own, not this intent's. */
  scope: boolean;
}

/** Share of intents that get each probe. */
const PROBE_SHARE = 0.25;

function shuffled<T>(items: T[], rng: Rng): T[] {
  const a = [...items];
  for (let i = a.length - 1; i > 0; i--) {
    const j = rng.int(i + 1);
    [a[i], a[j]] = [a[j]!, a[i]!];
  }
  return a;
}

/**
 * Each enabled delivery fault goes to an equal share of the intents (round robin, then shuffled);
 * each enabled probe to a quarter of them (at least one), chosen at random.
 */
export function planIntents(options: {
  intents: number;
  faults: readonly VerifyFault[];
  seed: number;
}): IntentPlan[] {
  const rng = createRng(options.seed);
  const n = options.intents;
  const deliveries = DELIVERIES.filter((d) => options.faults.includes(d));
  const order = shuffled(
    Array.from({ length: n }, (_, i) => (deliveries.length ? deliveries[i % deliveries.length]! : "once")),
    rng,
  );
  const plans: IntentPlan[] = order.map((delivery, i) => ({ n: i, delivery, mismatch: false, scope: false }));
  for (const probe of PROBES) {
    if (!options.faults.includes(probe) || n === 0) continue;
    const count = Math.max(1, Math.round(n * PROBE_SHARE));
    for (const i of shuffled(
      plans.map((p) => p.n),
      rng,
    ).slice(0, count)) {
      plans[i]![probe] = true;
    }
  }
  return plans;
}
