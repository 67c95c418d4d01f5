/**
 * The phases runner (recovery points): for requests whose work calls other systems, which no ROLLBACK
 * can undo. See index.ts for an example and the timeline of a key.
 */
import {
  type AtomicOutcome,
  type Claim,
  DEFAULT_REPLAYED_HEADERS,
  downstreamKey,
  isDatabaseUnavailable,
  isSaved,
  KeyInFlightError,
  LeaseLostError,
  OperationUncertainError,
  RetryableError,
  refsOf,
  type SavePolicy,
  SqlState,
  type StoredResponse,
  sqlStateOf,
} from "../../core/index.ts";
import { sentToReview, traceClaim, traceLookup, tracePhase } from "../../core/observe.ts";
import { KeyGate } from "../keys/gate.ts";
import { expiryOf, RECOVERY_DONE } from "../keys/row.ts";
import { type KeyTable, type PhaseStore, tableFor } from "../keys/table.ts";
import { acquire, type ClaimSettings } from "./claim.ts";
import {
  type CrashInfo,
  type CrashPointName,
  crashPoint,
  type PhaseFaults,
  SimulatedCrashError,
} from "./faults.ts";
import { noteFencingRefused, noteLookup } from "./history.ts";
import { advanceParams, fence, finishParams, heartbeat, type Lease, release, retryAfter } from "./lease.ts";
import { localTransaction } from "./local.ts";
import { notRunnable, type PhaseNeeds, phaseNeeds } from "./needs.ts";
import { markForReview } from "./review.ts";
import type { ExternalPhase, LocalPhase, Phase, PhaseContext, PhaseStep, PhasesOptions } from "./types.ts";

/**
 * The default lease: how long a crashed worker blocks its key. With the client's default deadline of
 * 30 s and Retry-After of at most 2 s, a call whose server died mid-provider-call sees the key taken
 * over about 10 s later and still gets its answer within its deadline (a 30 s lease never could).
 */
export const DEFAULT_LEASE_MS = 10_000;
/** How long a duplicate's claim waits for this process's claim of its key in progress, at most. */
const CLAIM_WAIT_MS = 5_000;

/** One claim of a key as it passes the key gate. */
interface ClaimCall<I> {
  readonly claim: Claim;
  readonly table: KeyTable;
  readonly input: I;
  readonly signal: AbortSignal | undefined;
}

/** Options of one `run`. */
export interface RunOptions {
  /**
   * The client's signal: if it is already aborted nothing is claimed, but once the lease is taken it is
   * ignored, so a hang-up never leaves a phase half-done or a lease held.
   */
  signal?: AbortSignal;
  /** This call's answer bound, in ms (see `PhasesOptions.answerWithinMs`). */
  answerWithinMs?: number;
}

/**
 * A request as a state machine of phases (made by `definePhases`): `run` claims the key, runs the phases
 * from its recovery point under a lease, and saves the answer; a retry, a takeover or the completer
 * resumes where the last one stopped.
 */
export class PhasesRunner<I = unknown, D extends Record<string, unknown> = Record<string, unknown>> {
  /** The store holding the keys. */
  readonly store: PhaseStore;
  /** The runner's name, stored with each key (the completer finds the runner by it). */
  readonly name: string;
  /** The phase a new key starts at. */
  readonly first: string;
  /** How long a lease lasts without a heartbeat, in milliseconds. */
  readonly leaseMs: number;
  /** How often the lease is renewed while a phase runs, in milliseconds. */
  readonly heartbeatMs: number;
  /** How long a request waits for its answer before it is answered 409 in flight, in milliseconds. */
  readonly answerWithinMs: number;
  private readonly phases: Record<string, Phase<I, D>>;
  /** What each phase needs in its data (needs.ts): recorded with a review, checked before each phase. */
  private readonly needs: PhaseNeeds;
  private readonly policy: SavePolicy;
  private readonly replayHeaders: readonly string[];
  private readonly faults: PhaseFaults | undefined;
  private readonly options: PhasesOptions<I, D>;
  private readonly claimSettings: ClaimSettings;
  private readonly maxLookupFailures: number;
  /**
   * The key gate every claim passes (keys/gate.ts), whose attempt is the claim (claim.ts). A claim of a
   * key whose claim is in progress in this process waits for that one to settle first (bounded by
   * CLAIM_WAIT_MS, then it claims anyway), then reads the key before claiming it: it meets a committed
   * row (a replay, or 409 while the lease is live) instead of queueing on an uncommitted one. Without
   * this, a storm of duplicates queued on the first claim's row, each holding a pooled connection
   * meanwhile; on Citus, where a claim is a distributed transaction, the queue held every worker
   * connection it needed to commit, and duplicates were answered 503 after the pool's connection wait
   * (test/production/citus.slow.test.ts). A claim never says busy: a live lease is answered 409 at once.
   */
  private readonly gate: KeyGate<ClaimCall<I>, AtomicOutcome | Lease<I, D>>;

  constructor(options: PhasesOptions<I, D>) {
    const names = Object.keys(options.phases);
    if (names.length === 0) throw new Error("definePhases: give at least one phase");
    if (RECOVERY_DONE in options.phases) throw new Error(`definePhases: "${RECOVERY_DONE}" is reserved`);
    this.options = options;
    this.store = options.store;
    this.name = options.name;
    this.phases = options.phases;
    this.needs = phaseNeeds(options.phases);
    this.first = options.first ?? names[0]!;
    if (!(this.first in this.phases)) throw new Error(`definePhases: no phase named "${this.first}"`);
    for (const [name, p] of Object.entries(this.phases)) {
      if (p.next !== undefined && !(p.next in this.phases)) {
        throw new Error(`definePhases: phase "${name}" goes on to "${p.next}", which is not a phase`);
      }
    }
    this.leaseMs = options.leaseMs ?? DEFAULT_LEASE_MS;
    this.heartbeatMs = options.heartbeatMs ?? Math.floor(this.leaseMs / 3);
    this.answerWithinMs = options.answerWithinMs ?? 5_000;
    this.maxLookupFailures = Math.max(1, options.maxLookupFailures ?? 5);
    this.policy = { saveStatuses: options.saveStatuses, saveServerErrors: options.saveServerErrors };
    this.replayHeaders = options.replayHeaders ?? DEFAULT_REPLAYED_HEADERS;
    this.faults = options.faults;
    this.claimSettings = {
      name: this.name,
      first: this.first,
      leaseMs: this.leaseMs,
      asyncRecoveryPoints: options.asyncRecoveryPoints ?? true,
      onLeaseTakeover: options.onLeaseTakeover,
    };
    this.gate = new KeyGate<ClaimCall<I>, AtomicOutcome | Lease<I, D>>({
      boundMs: () => CLAIM_WAIT_MS,
      // The database's clock as the key's table estimates it (a store without an estimate: this process's).
      now: (call) => call.table.estimatedNowMs?.() ?? Date.now(),
      attemptPastQueue: true,
      attempt: async (call, waited) => {
        const value = await traceClaim(() =>
          acquire<I, D>(this.claimSettings, call.table, call.claim, call.input, call.signal, waited),
        );
        return { kind: "answer", value, finished: true };
      },
    });
  }

  /**
   * Run (or resume, or replay) the request under `claim`. Returns the same outcomes as atomic mode, or
   * throws: `KeyMismatchError` (another request under this key; no lease is taken), `KeyInFlightError`
   * (another worker holds a live lease, or this request's phases are still running at the answer
   * bound: they go on in the background), `OperationUncertainError` (the key is in review),
   * `LeaseLostError` (this worker's lease was taken over: it stopped and wrote nothing more),
   * `RetryableError` (transient; the lease was freed), or whatever a phase threw (the lease was freed
   * too). `input` must be JSON: it is stored with a new key, and a key that exists resumes with ITS
   * stored input, whatever this call passes.
   */
  async run(claim: Claim, input: I, options: RunOptions = {}): Promise<AtomicOutcome> {
    const started = performance.now();
    const table = tableFor(this.store, claim.scope);
    const acquired = await this.gate.pass({ claim, table, input, signal: options.signal });
    if ("kind" in acquired) return acquired;
    const driving = this.drive(acquired);
    const bound = options.answerWithinMs ?? this.answerWithinMs;
    if (!(bound < Number.POSITIVE_INFINITY)) return driving;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const early = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => {
          // The phases go on, holding (and renewing) the lease; the retry replays what they end in.
          driving.catch((err) =>
            this.options.onBackgroundError?.(err, { scope: claim.scope, key: claim.key }),
          );
          reject(new KeyInFlightError(retryAfter(this.leaseMs / 1000), acquired.claimId));
        },
        Math.max(0, bound - (performance.now() - started)),
      );
    });
    try {
      return await Promise.race([driving, early]);
    } finally {
      clearTimeout(timer);
    }
  }

  // ---- running the phases --------------------------------------------------------------------------

  private async drive(lease: Lease<I, D>): Promise<AtomicOutcome> {
    const lost = new AbortController();
    const ctx = this.context(lease, lost.signal);
    try {
      await this.crashPoint("after-claim", lease);
      for (;;) {
        const phase = this.phases[lease.point];
        // A key at a phase this runner lacks, or without what the phase needs: a person's (needs.ts).
        const unrunnable = notRunnable(lease.point, phase, lease.data as Record<string, unknown>);
        if (unrunnable || !phase) return await this.toReview(lease, unrunnable ?? "");
        await this.crashPoint("before-phase", lease);
        const outcome = await tracePhase(lease.point, "external" in phase, () =>
          "external" in phase ? this.runExternal(phase, lease, ctx, lost) : this.runLocal(phase, lease, ctx),
        );
        if (outcome) return outcome;
      }
    } catch (err) {
      if (err instanceof LeaseLostError) await noteFencingRefused(lease);
      // A crash frees nothing (a dead process cannot); a lost lease is not ours to free; a key sent to
      // review has no lease left.
      if (
        err instanceof SimulatedCrashError ||
        err instanceof LeaseLostError ||
        err instanceof OperationUncertainError
      ) {
        throw err;
      }
      // Anything else: free the lease at once, so that the retry need not wait for it to expire. Our own
      // statement, never tied to the client's signal: a hang-up cannot cancel it.
      try {
        await release(lease);
      } catch (releaseError) {
        // The database went away (the usual reason both fail): the lease expires on its own, and the
        // caller answers 503 + Retry-After for an unavailable database, as for any other statement.
        if (isDatabaseUnavailable(releaseError)) throw isDatabaseUnavailable(err) ? err : releaseError;
        throw new AggregateError([err, releaseError], "the phase failed and freeing its lease failed too");
      }
      if (
        sqlStateOf(err) === SqlState.LockNotAvailable ||
        sqlStateOf(err) === SqlState.SerializationFailure ||
        sqlStateOf(err) === SqlState.DeadlockDetected
      ) {
        throw new RetryableError("The database was busy; retry with the same key.", { cause: err });
      }
      throw err;
    }
  }

  private async runExternal(
    phase: ExternalPhase<I, D>,
    lease: Lease<I, D>,
    ctx: PhaseContext<I, D>,
    lost: AbortController,
  ): Promise<AtomicOutcome | undefined> {
    // A system without idempotency keys: never call it twice blindly.
    const notIdempotent = !(phase.idempotent ?? phase.lookup === undefined);
    if (notIdempotent && lease.attempted) {
      const found = await this.lookUp(phase, lease, ctx, "a call may have reached the provider");
      if (found) return this.record(phase, lease, found);
    }
    if (notIdempotent) {
      // Durable (never asynchronous): a crash must not forget that a call may have begun.
      const r = await lease.table.db.query(lease.sql.attempt, fence(lease));
      if (r.rowCount !== 1) throw new LeaseLostError();
      lease.attempted = true;
    }
    const stop = heartbeat(lease, this.leaseMs, this.heartbeatMs, lost);
    let step: PhaseStep<D> | undefined;
    lease.calling = true; // until what it returned is recorded (`record` below)
    try {
      step = await phase.external(ctx);
    } catch (err) {
      if (lost.signal.aborted) throw new LeaseLostError();
      if (!notIdempotent) throw err;
      // The outcome is unknown (a timeout may come after the provider acted): look before anything else.
      const found = await this.lookUp(
        phase,
        lease,
        ctx,
        `the call failed (${String((err as Error)?.message ?? err)})`,
      );
      if (found) step = found;
      else throw err; // not there: the lease is freed, the next attempt looks again before it calls
    } finally {
      stop();
    }
    // The heartbeat saw another token: whatever the call returned, this worker records nothing.
    if (lost.signal.aborted) throw new LeaseLostError();
    await this.crashPoint("after-external", lease);
    return this.record(phase, lease, step);
  }

  /**
   * Ask the phase's `lookup` for the effect of an earlier call. Returns the step found, or undefined
   * when the system is sure there is none. Without a lookup, or after too many that could not tell,
   * the key goes to review and `OperationUncertainError` is thrown; a lookup that cannot tell frees
   * the lease and throws `RetryableError`.
   */
  private async lookUp(
    phase: ExternalPhase<I, D>,
    lease: Lease<I, D>,
    ctx: PhaseContext<I, D>,
    why: string,
  ): Promise<PhaseStep<D> | undefined> {
    if (!phase.lookup) return this.toReview(lease, `${why}; the phase has no lookup`);
    try {
      return await noteLookup(
        lease,
        (await traceLookup(lease.point, async () => await phase.lookup!(ctx))) ?? undefined,
      );
    } catch (err) {
      const message = String((err as Error)?.message ?? err);
      const r = await lease.table.db.query<{ lookup_failures: number }>(lease.sql.lookupFailed, fence(lease));
      if (r.rows.length === 0) throw new LeaseLostError();
      if (Number(r.rows[0]!.lookup_failures) >= this.maxLookupFailures) {
        return this.toReview(lease, `${why}; ${this.maxLookupFailures} lookups could not tell (${message})`);
      }
      throw new RetryableError(`Could not find out whether the call took effect (${message}); retry later.`, {
        cause: err,
      });
    }
  }

  private async toReview(lease: Lease<I, D>, reason: string): Promise<never> {
    if (!(await markForReview(lease as Lease<unknown, unknown>, reason, this.needs))) {
      throw new LeaseLostError();
    }
    const { scope, key } = lease.claim;
    this.options.onNeedsReview?.({ scope, key, point: lease.point, reason });
    sentToReview(lease.point, reason);
    throw new OperationUncertainError(refsOf(lease.table).encode(scope, key, lease.claimId));
  }

  /** Record what an external phase (or its lookup) returned: the answer, or the next point. */
  private async record(
    phase: ExternalPhase<I, D>,
    lease: Lease<I, D>,
    step: PhaseStep<D> | undefined,
  ): Promise<AtomicOutcome | undefined> {
    const db = lease.table.db;
    if (step?.review) return this.toReview(lease, step.review);
    if (step?.response) {
      if (!isSaved(step.response.status, this.policy)) {
        await release(lease);
        return this.executed(lease, step.response, false);
      }
      const r = await db.query(lease.sql.finish, finishParams(lease, step, this.replayHeaders));
      if (r.rowCount !== 1) throw new LeaseLostError();
      return this.executed(lease, step.response, true);
    }
    const next = this.nextOf(lease.point, phase, step);
    const advance = this.claimSettings.asyncRecoveryPoints ? lease.sql.advanceAsync : lease.sql.advance;
    const params = advanceParams(lease, next, step?.data, this.leaseMs);
    if (!this.faults && db.supportsBefore && "local" in this.phases[next]!) {
      // Committed on its own just before the next phase's BEGIN, on its connection: one write for
      // both. Not a weaker recovery point: it still commits before the local phase begins, and a crash
      // in between leaves the same states as before (the call recorded, or not yet). A fenced UPDATE
      // that finds another token changes nothing, and the local phase's fence then finds it too. With
      // fault hooks, it is written here, so that every hook sees it committed.
      lease.unrecorded = { sql: advance, params };
    } else {
      const r = await db.query(advance, params);
      // advanceAsync is a SELECT over the UPDATE's rows (sql.ts): a row each, whatever the driver counts.
      if (Math.max(r.rowCount, r.rows.length) !== 1) throw new LeaseLostError();
      lease.calling = false; // recorded: the call's effect is the recovery point's now
    }
    lease.point = next;
    lease.attempted = false;
    Object.assign(lease.data, step?.data);
    return undefined;
  }

  private async runLocal(
    phase: LocalPhase<I, D>,
    lease: Lease<I, D>,
    ctx: PhaseContext<I, D>,
  ): Promise<AtomicOutcome | undefined> {
    const result = await localTransaction(phase, lease, ctx, {
      name: this.name,
      policy: this.policy,
      replayHeaders: this.replayHeaders,
      leaseMs: this.leaseMs,
      crashPoint: (point) => this.crashPoint(point, lease),
      nextOf: (step) => this.nextOf(lease.point, phase, step),
    });
    lease.calling = false; // an external call before it is recorded now (`before` committed first)
    if (result.kind === "unsaved") {
      // Free the lease and answer this caller only.
      await release(lease);
      return this.executed(lease, result.response, false);
    }
    await this.crashPoint("after-commit", lease);
    if (result.kind === "finished") return this.executed(lease, result.response, true);
    lease.point = result.next;
    Object.assign(lease.data, result.data);
    return undefined;
  }

  private context(lease: Lease<I, D>, signal: AbortSignal): PhaseContext<I, D> {
    const { scope, key } = lease.claim;
    return {
      scope,
      key,
      claimId: lease.claimId,
      idempotencyKey: downstreamKey(scope, key, lease.claimId),
      get operationRef() {
        return refsOf(lease.table).encode(scope, key, lease.claimId);
      },
      input: lease.input,
      signal,
      get data() {
        return lease.data;
      },
      get phase() {
        return lease.point;
      },
      crash: (point: string) => this.crashPoint(point, lease),
    };
  }

  private crashPoint(point: CrashPointName, lease: Lease<I, D>): Promise<void> {
    const info: CrashInfo = { point, phase: lease.point, scope: lease.claim.scope, key: lease.claim.key };
    return crashPoint(this.faults, info);
  }

  private nextOf(point: string, phase: Phase<I, D>, step: PhaseStep<D> | undefined): string {
    const next = step?.next ?? phase.next;
    if (next === undefined) {
      throw new Error(`phases "${this.name}": phase "${point}" returned no response and has no next phase`);
    }
    if (!(next in this.phases)) throw new Error(`phases "${this.name}": "${next}" is not a phase`);
    return next;
  }

  private executed(lease: Lease<I, D>, response: StoredResponse, saved: boolean): AtomicOutcome {
    return {
      kind: "executed",
      response,
      saved,
      expiresAt: expiryOf(lease.table, { created_at: lease.createdAt }),
      claimId: lease.claimId,
    };
  }
}

/** Define a phases runner (see index.ts). */
export function definePhases<I = unknown, D extends Record<string, unknown> = Record<string, unknown>>(
  options: PhasesOptions<I, D>,
): PhasesRunner<I, D> {
  return new PhasesRunner<I, D>(options);
}
