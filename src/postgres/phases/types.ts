/** What a phases runner is made of: phases, what they see, what they return, and its options. */
import type { SavePolicy, StoredResponse } from "../../core/index.ts";
import type { Tx } from "../db.ts";
import type { PhaseStore } from "../keys/table.ts";
import type { PhaseFaults } from "./faults.ts";

/** What a phase hands back. */
export type PhaseStep<D> =
  /** Go on to the next phase (`next`, default: the phase's own `next`), merging `data` into the key's phase data. */
  | { data?: Partial<D>; next?: string; response?: undefined; review?: undefined }
  /**
   * The request's answer. A final one (2xx, or a status in `saveStatuses` such as 402 declined) is saved
   * as done and replayed from then on; any other is sent to this caller only, and the lease is freed.
   */
  | { response: StoredResponse; data?: Partial<D>; next?: undefined; review?: undefined }
  /**
   * Hand the key to a person, with this reason (external phases only): it waits in review (the
   * console's queue, `idem keys settle`) at this phase, answered 409 operation-uncertain, until settled.
   */
  | { review: string; data?: undefined; next?: undefined; response?: undefined };

/** What a phase sees. */
export interface PhaseContext<I, D> {
  /** The key's scope (e.g. the account). */
  readonly scope: string;
  /** The request's idempotency key. */
  readonly key: string;
  /**
   * This claim's identity (`keys.claim_id`): the same on every retry, takeover and completer run of the
   * claim, new when the key expired and was claimed again. Null for a row claimed before sql/0008.
   */
  readonly claimId: string | null;
  /**
   * The key to hand to the external system: `<scope>:<claim id>` (`downstreamKey`), naming this claim
   * of the key. The same on every retry and takeover; a key reused after its expiry gets a new one, so
   * the provider never answers it with an old claim's effect. For a provider without idempotency keys,
   * send it as your reference (metadata), so `lookup` can find it.
   */
  readonly idempotencyKey: string;
  /**
   * This claim's `operation_ref` (opaque, sealed by the store): what a problem answer hands the client
   * and a person looks the key up by.
   */
  readonly operationRef: string;
  /**
   * The input stored by the key's FIRST request (the `input` given to that `run`). A retry, a takeover
   * and the completer all resume with it, never with their own: one key, one meaning.
   */
  readonly input: I;
  /** What earlier phases of this key returned as `data`, merged. */
  readonly data: Partial<D>;
  /** The phase being run. */
  readonly phase: string;
  /**
   * Aborted when this worker learns its lease was taken over (the heartbeat found another token). Pass it
   * to the external call. It is NOT the client's signal: a client hanging up never stops a phase.
   */
  readonly signal: AbortSignal;
  /** A named crash point for fault-injection tests (does nothing unless the runner was given `faults`). */
  crash(point: string): Promise<void>;
}

/** A phase that calls another system (a payment provider): outside any transaction, never rolled back. */
export interface ExternalPhase<I, D> {
  /**
   * One call to another system, made idempotent with `ctx.idempotencyKey`. Throw `RetryableError` for a
   * transient failure (timeout, 5xx, dropped connection): the lease is freed and the retry runs the phase
   * again. Do not write to the database here: whatever it returns is recorded by the runner, fenced.
   */
  external: (ctx: PhaseContext<I, D>) => Promise<PhaseStep<D> | undefined>;
  /** The phase after this one. */
  next?: string;
  /** Fields of the key's data this phase cannot run without (needs.ts). Default: none. */
  needs?: readonly (keyof D & string)[];
  /**
   * Whether the other system dedups by `ctx.idempotencyKey` (a repeat returns the first result).
   * Default: true, unless `lookup` is given. When false, the runner records (durably) that a call may
   * have begun before each call, and after an unknown outcome (a throw, a crash, a lost lease) it never
   * calls again blindly: it asks `lookup`, and without one the key goes to review (409
   * operation-uncertain).
   */
  idempotent?: boolean;
  /**
   * For a system without idempotency keys: find the effect of an earlier call of this phase, by our
   * reference (`ctx.idempotencyKey`). Return the step that call would have returned (found), `undefined`
   * when the system is sure there is none (the runner then calls again), or throw when it cannot tell
   * now (the lease is freed; after `maxLookupFailures` such throws the key goes to review).
   */
  lookup?: (ctx: PhaseContext<I, D>) => Promise<PhaseStep<D> | undefined>;
}

/** A phase that writes to this database, in one transaction with the key's recovery point. */
export interface LocalPhase<I, D> {
  /**
   * One local transaction: write through `tx` only. It commits together with the recovery point, and only
   * if this worker still holds the lease (its key row is locked, token checked, before any of its
   * statements is answered: on a pipelining driver the first one leaves with that lock, and is rolled
   * back, its promise rejected with `LeaseLostError`, when the lease was lost).
   */
  local: (ctx: PhaseContext<I, D>, tx: Tx) => Promise<PhaseStep<D> | undefined>;
  /** The phase after this one, when it does not answer. */
  next?: string;
  /**
   * Fields of the key's data this phase cannot run without (e.g. `["chargeId"]`): a settlement that
   * resumes the key here without them is refused, and a key that reaches the phase without them goes
   * to review instead of failing every retry (needs.ts). Default: none.
   */
  needs?: readonly (keyof D & string)[];
}

/** One step of a phases runner: an external call or a local transaction. */
export type Phase<I, D> = ExternalPhase<I, D> | LocalPhase<I, D>;

/** Options of `definePhases`: the store, the runner's name, its phases and how leases behave. */
export interface PhasesOptions<I, D> extends SavePolicy {
  /**
   * The store holding the keys (its database's clock drives lease expiry): a `PostgresStore`, or a `ShardedStore`
   * (each key is then claimed and run on its scope's shard). Required.
   */
  store: PhaseStore;
  /** The runner's name, stored with each key so the completer knows which runner resumes it. Required. */
  name: string;
  /** The phases by name. `"done"` is reserved. Required. */
  phases: Record<string, Phase<I, D>>;
  /** The phase a new key starts in. Default: the first one listed in `phases`. */
  first?: string;
  /**
   * How long a lease lasts without renewal, in ms: the longest a crashed worker blocks its key (retries
   * meanwhile get 409 with `Retry-After`). The heartbeat renews it while an external call runs, so a
   * call may take longer; keep it well under your clients' deadline (idem's client: 30 s), so that a
   * retry after a crash is answered within it. Default: 10,000.
   */
  leaseMs?: number;
  /** How often an external phase renews its lease, in ms; 0 turns the heartbeat off. Default: `leaseMs / 3`. */
  heartbeatMs?: number;
  /**
   * The answer bound: the longest `run` holds its caller. A request whose phases are still running then
   * gets `KeyInFlightError` (409 with `Retry-After`) while the phases go on in the background, holding
   * and renewing the lease; the retry replays the result. `Infinity` waits to the end (the completer
   * does). Overridden per call by `run(..., { answerWithinMs })`. Default: 5,000 (docs/contract.md).
   */
  answerWithinMs?: number;
  /**
   * Lookups (`ExternalPhase.lookup`) that could not tell, in a row, before a key goes to review.
   * Default: 5.
   */
  maxLookupFailures?: number;
  /**
   * Commit the claim and the recovery point that follows an external phase without waiting for the WAL
   * flush (`synchronous_commit = off`, for that one statement; visibility to other workers is the same).
   * Safe because an external phase is idempotent by our key: if a database crash loses such a commit,
   * the key is back at its claim or at the external phase, and the retry (or the completer) repeats the
   * call, which the provider answers with the same result. A local phase commits durably, and its WAL
   * flush makes every earlier commit durable with it, so nothing a client was told is ever lost.
   * Saves two disk flushes per payment. Default: true. (The record that a call to a system WITHOUT
   * idempotency may have begun is always committed durably.)
   */
  asyncRecoveryPoints?: boolean;
  /** Response headers saved with a final answer. Default: `DEFAULT_REPLAYED_HEADERS` (never Set-Cookie). */
  replayHeaders?: readonly string[];
  /** Fault hooks for tests (crash points, stalls). Default: none, and no cost on the hot path. */
  faults?: PhaseFaults;
  /**
   * Called when this runner takes over a key whose previous worker's lease had expired (a crashed or
   * too slow worker), for metrics and logs. Default: none.
   */
  onLeaseTakeover?: (event: { scope: string; key: string; point: string }) => void;
  /** Called when a key goes to review (metrics, alerts). Default: none. */
  onNeedsReview?: (event: { scope: string; key: string; point: string; reason: string }) => void;
  /**
   * Called with what phases that went on in the background after an early answer (`answerWithinMs`)
   * ended in, when that was an error (logs). Default: none (the retry sees the key's state anyway).
   */
  onBackgroundError?: (error: unknown, event: { scope: string; key: string }) => void;
}

/** A build-your-own JSON response for phases. */
export function jsonResponse(
  status: number,
  body: unknown,
  headers: Array<[string, string]> = [],
): StoredResponse {
  return {
    status,
    headers: [["content-type", "application/json"], ...headers],
    body: new TextEncoder().encode(JSON.stringify(body)),
  };
}
