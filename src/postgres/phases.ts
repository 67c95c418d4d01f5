/**
 * Phases mode (recovery points): for requests whose work calls other systems, which no ROLLBACK can undo.
 *
 * A request is a small state machine of named phases, e.g. `started -> charged -> done`. Each phase is
 * either ONE local transaction or ONE external call made idempotent by a key derived from ours
 * (`ctx.idempotencyKey`, `<scope>:<key>`). Never two external calls in one phase: a crash between them
 * would leave no way to tell which one happened.
 *
 *   const payments = definePhases<{ amount: number }, { chargeId: string }>({
 *     store,
 *     name: "payments",
 *     phases: {
 *       started: {
 *         external: async (ctx) => {
 *           const r = await chargeProvider(url, { amount: ctx.input.amount, idempotencyKey: ctx.idempotencyKey });
 *           if (r.kind === "declined") return { response: jsonResponse(402, { error: "card declined" }) };
 *           if (r.kind !== "charged") throw new RetryableError("provider unavailable");
 *           return { data: { chargeId: r.charge.id } };
 *         },
 *         next: "charged",
 *       },
 *       charged: {
 *         local: async (ctx, tx) => {
 *           await tx.query("INSERT INTO payments ...", [ctx.data.chargeId]);
 *           return { response: jsonResponse(201, { charge: ctx.data.chargeId }) };
 *         },
 *       },
 *     },
 *   });
 *   const outcome = await payments.run(claim, { amount: 5000 });
 *
 * How a key moves (timeline of one request and its retry):
 *   lookup (no lease taken yet) -- another fingerprint: 422; done: replay; a live lease: 409 + Retry-After
 *   claim / take the lease: one committed statement (random token, expiry from the store's clock)
 *   external phase: the call runs with a heartbeat renewing the lease; then ONE fenced UPDATE records
 *     the next point and the phase's data (`... AND lease_token = mine`; 0 rows: LeaseLostError)
 *   local phase: BEGIN; lock the key row WITH the token check (FOR UPDATE); the phase's own writes;
 *     advance the point (or save the final response and drop the lease); COMMIT. A takeover waits on
 *     the row lock, and a stale worker never gets past the lock, so the fence covers the business rows.
 *   a final answer (2xx, or a business answer such as 402 declined) is saved as done and replayed;
 *   a transient failure (RetryableError: timeout, 5xx) frees the lease at once and is rethrown;
 *   a crash leaves the lease to expire; the next retry (or the completer) resumes at the saved point.
 */
import { randomUUID } from "node:crypto";
import {
  type AtomicOutcome,
  type Claim,
  DEFAULT_REPLAYED_HEADERS,
  filterHeaders,
  isSaved,
  KeyInFlightError,
  LeaseLostError,
  RetryableError,
  type SavePolicy,
  type StoredResponse,
} from "../core/index.ts";
import type { Tx } from "./db.ts";
import { type KeyRow, type PostgresStore, RECOVERY_DONE, sqlState } from "./store.ts";

/** What a phase hands back. */
export type PhaseStep<D> =
  /** Go on to the next phase (`next`, default: the phase's own `next`), merging `data` into the key's phase data. */
  | { data?: Partial<D>; next?: string; response?: undefined }
  /**
   * The request's answer. A final one (2xx, or a status in `saveStatuses` such as 402 declined) is saved
   * as done and replayed from then on; any other is sent to this caller only, and the lease is freed.
   */
  | { response: StoredResponse; data?: Partial<D>; next?: undefined };

/** What a phase sees. */
export interface PhaseContext<I, D> {
  readonly scope: string;
  readonly key: string;
  /** The key to hand to the external system: `<scope>:<key>`. The same on every retry and takeover. */
  readonly idempotencyKey: string;
  /** The runner's input (given to `run`, or stored with the key when the completer resumes it). */
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

export interface ExternalPhase<I, D> {
  /**
   * One call to another system, made idempotent with `ctx.idempotencyKey`. Throw `RetryableError` for a
   * transient failure (timeout, 5xx, dropped connection): the lease is freed and the retry runs the phase
   * again. Do not write to the database here: whatever it returns is recorded by the runner, fenced.
   */
  external: (ctx: PhaseContext<I, D>) => Promise<PhaseStep<D> | undefined>;
  /** The phase after this one. */
  next?: string;
}

export interface LocalPhase<I, D> {
  /**
   * One local transaction: write through `tx` only. It commits together with the recovery point, and only
   * if this worker still holds the lease (its key row is locked, token checked, before this runs).
   */
  local: (ctx: PhaseContext<I, D>, tx: Tx) => Promise<PhaseStep<D> | undefined>;
  /** The phase after this one, when it does not answer. */
  next?: string;
}

export type Phase<I, D> = ExternalPhase<I, D> | LocalPhase<I, D>;

/** Where the runner asks the fault hooks (tests) whether to crash. `ctx.crash(name)` adds custom ones. */
export type CrashPointName =
  | "after-claim"
  | "before-phase"
  | "after-external"
  | "before-commit"
  | "after-commit"
  | (string & {});

export interface CrashInfo {
  point: CrashPointName;
  /** The phase being run (or about to run). */
  phase: string;
  scope: string;
  key: string;
}

/**
 * Fault injection for tests (see `idem/testing`). `at` is asked at every named point; resolve `true` to
 * "crash" there: the runner throws `SimulatedCrashError` and, like a dead process, frees nothing (the
 * lease has to expire). It may also wait, to model a worker that stalls.
 */
export interface PhaseFaults {
  at(info: CrashInfo): boolean | Promise<boolean>;
}

/** Thrown at a crash point chosen by `faults`. Never thrown in production (no `faults`, no crash). */
export class SimulatedCrashError extends Error {
  override name = "SimulatedCrashError";
  readonly info: CrashInfo;
  constructor(info: CrashInfo) {
    super(`simulated crash at ${info.point} (phase ${info.phase})`);
    this.info = info;
  }
}

export interface PhasesOptions<I, D> extends SavePolicy {
  /** The store holding the keys (its clock drives lease expiry). Required. */
  store: PostgresStore;
  /** The runner's name, stored with each key so the completer knows which runner resumes it. Required. */
  name: string;
  /** The phases by name. `"done"` is reserved. Required. */
  phases: Record<string, Phase<I, D>>;
  /** The phase a new key starts in. Default: the first one listed in `phases`. */
  first?: string;
  /**
   * How long a lease lasts without renewal, in ms: the longest a crashed worker blocks its key (retries
   * meanwhile get 409 with `Retry-After`). Keep external calls' own timeouts well under it. Default: 30,000.
   */
  leaseMs?: number;
  /** How often an external phase renews its lease, in ms; 0 turns the heartbeat off. Default: `leaseMs / 3`. */
  heartbeatMs?: number;
  /**
   * Commit the claim and the recovery point that follows an external phase without waiting for the WAL
   * flush (`synchronous_commit = off`, for that one statement; visibility to other workers is the same).
   * Safe because an external phase is idempotent by our key: if a database crash loses such a commit,
   * the key is back at its claim or at the external phase, and the retry (or the completer) repeats the
   * call, which the provider answers with the same result. A local phase commits durably, and its WAL
   * flush makes every earlier commit durable with it, so nothing a client was told is ever lost.
   * Saves two disk flushes per payment. Default: true.
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

/** This worker's hold on one key. */
interface Lease<I, D> {
  claim: Claim;
  bucket: number;
  token: string;
  point: string;
  data: Partial<D>;
  createdAt: Date;
  input: I;
}

/** Carries an unsaved answer out of a local transaction, rolling it back. */
class Unsaved {
  constructor(readonly response: StoredResponse) {}
}
const CONFLICT = Symbol("conflict");

/**
 * The `Retry-After` of a 409 while another worker holds the lease: the time left on the lease, capped
 * at MAX_IN_FLIGHT_RETRY_AFTER_S. A live holder usually finishes in milliseconds, and a hint as long as
 * the whole lease would make a client with a shorter deadline give up on a double-tap at once; a
 * crashed holder's key is taken over as soon as its lease runs out, which short retries notice.
 */
export const MAX_IN_FLIGHT_RETRY_AFTER_S = 2;
function retryAfter(until: Date | string | null | undefined, now: number): number {
  if (!until) return 1;
  const left = Math.ceil((new Date(until).getTime() - now) / 1000);
  return Math.min(MAX_IN_FLIGHT_RETRY_AFTER_S, Math.max(1, left));
}

export class PhasesRunner<I = unknown, D extends Record<string, unknown> = Record<string, unknown>> {
  readonly store: PostgresStore;
  readonly name: string;
  readonly first: string;
  readonly leaseMs: number;
  readonly heartbeatMs: number;
  private readonly phases: Record<string, Phase<I, D>>;
  private readonly policy: SavePolicy;
  private readonly replayHeaders: readonly string[];
  private readonly faults: PhaseFaults | undefined;
  private readonly onLeaseTakeover: PhasesOptions<I, D>["onLeaseTakeover"];
  private readonly asyncRecoveryPoints: boolean;
  private readonly sql: ReturnType<typeof statements>;

  constructor(options: PhasesOptions<I, D>) {
    const names = Object.keys(options.phases);
    if (names.length === 0) throw new Error("definePhases: give at least one phase");
    if (RECOVERY_DONE in options.phases) throw new Error(`definePhases: "${RECOVERY_DONE}" is reserved`);
    this.store = options.store;
    this.name = options.name;
    this.phases = options.phases;
    this.first = options.first ?? names[0]!;
    if (!(this.first in this.phases)) throw new Error(`definePhases: no phase named "${this.first}"`);
    for (const [name, p] of Object.entries(this.phases)) {
      if (p.next !== undefined && !(p.next in this.phases)) {
        throw new Error(`definePhases: phase "${name}" goes on to "${p.next}", which is not a phase`);
      }
    }
    this.leaseMs = options.leaseMs ?? 30_000;
    this.heartbeatMs = options.heartbeatMs ?? Math.floor(this.leaseMs / 3);
    this.policy = { saveStatuses: options.saveStatuses, saveServerErrors: options.saveServerErrors };
    this.replayHeaders = options.replayHeaders ?? DEFAULT_REPLAYED_HEADERS;
    this.faults = options.faults;
    this.onLeaseTakeover = options.onLeaseTakeover;
    this.asyncRecoveryPoints = options.asyncRecoveryPoints ?? true;
    this.sql = statements(this.store.schema);
  }

  /**
   * Run (or resume, or replay) the request under `claim`. Returns the same outcomes as atomic mode, or
   * throws: `KeyMismatchError` (another request under this key; no lease is taken), `KeyInFlightError`
   * (another worker holds a live lease), `LeaseLostError` (this worker's lease was taken over: it stopped
   * and wrote nothing more), `RetryableError` (transient; the lease was freed), or whatever a phase threw
   * (the lease was freed too). `input` must be JSON: it is stored for the completer.
   *
   * `signal` is the client's: if it is already aborted nothing is claimed, but once the lease is taken it
   * is ignored, so a hang-up never leaves a phase half-done or a lease held.
   */
  async run(claim: Claim, input: I, options: { signal?: AbortSignal } = {}): Promise<AtomicOutcome> {
    const got = await this.acquire(claim, input, options.signal);
    if ("kind" in got) return got;
    return this.drive(got);
  }

  // ---- taking the key ------------------------------------------------------------------------------

  private async acquire(
    claim: Claim,
    input: I,
    signal: AbortSignal | undefined,
  ): Promise<AtomicOutcome | Lease<I, D>> {
    const store = this.store;
    let row: KeyRow | undefined;
    const now = store.clock();
    const { bucket, marker } = store.placement(now, true);
    if (!marker && !signal?.aborted) {
      // The common case in one round trip: look the key up and, if it is new, claim it with our lease.
      const token = randomUUID();
      const at = { bucket, createdAt: new Date(now).toISOString(), nowMs: now };
      const got = await store.withPartitions(() =>
        store.lookupOrClaimPhases(claim, at, this.claimColumns(token, now, input), {
          asyncCommit: this.asyncRecoveryPoints,
        }),
      );
      if (got.claimed) return this.newLease(claim, bucket, token, now, input);
      row =
        got.row ?? (await store.lookup(store.db, claim.scope, claim.key, store.clock(), { phases: true }));
    } else {
      row = await store.lookup(store.db, claim.scope, claim.key, now, { phases: true });
    }
    let withMarker = true;
    for (let attempt = 0; ; attempt++) {
      if (row) {
        // Body check BEFORE the lease: a wrong request must not block the real retry for a lease's length.
        const replay = store.replayOf(claim, row);
        if (replay) return replay;
        return this.takeLease(claim, row, input);
      }
      if (signal?.aborted) {
        throw new RetryableError("The client went away before the key was claimed; nothing was done.");
      }
      const lease = await this.claimNew(claim, input, withMarker);
      if (lease) return lease;
      // Someone claimed it first (or an expired row blocked our boundary marker): read what is there.
      row = await store.lookup(store.db, claim.scope, claim.key, store.clock(), { phases: true });
      if (!row) {
        if (attempt >= 2) throw new KeyInFlightError(1);
        withMarker = false;
      }
    }
  }

  private claimColumns(token: string, now: number, input: I) {
    return {
      recoveryPoint: this.first,
      leaseToken: token,
      leaseUntil: new Date(now + this.leaseMs),
      runner: this.name,
      request: JSON.stringify(input ?? null),
    };
  }

  private newLease(claim: Claim, bucket: number, token: string, now: number, input: I): Lease<I, D> {
    return { claim, bucket, token, point: this.first, data: {}, createdAt: new Date(now), input };
  }

  /**
   * Insert the key row with our lease, committed at once (the claim of `store.insertClaim`, shared with
   * the boundary-marker logic). Undefined when someone else's row is there.
   */
  private async claimNew(claim: Claim, input: I, withMarker: boolean): Promise<Lease<I, D> | undefined> {
    const store = this.store;
    const now = store.clock();
    const { bucket, marker } = store.placement(now, withMarker);
    const token = randomUUID();
    const at = { bucket, marker, createdAt: new Date(now).toISOString() };
    const columns = this.claimColumns(token, now, input);
    const claimed = await store.withPartitions(async () => {
      // Without a marker it is one statement; with one, the two rows must go in together or not at
      // all, hence the transaction.
      if (!marker) return store.insertClaim(store.db, claim, at, columns);
      return store.db
        .transaction(async (tx) => {
          if (!(await store.insertClaim(tx, claim, at, columns))) throw CONFLICT;
          return true;
        })
        .catch((err) => {
          if (err === CONFLICT) return false;
          throw err;
        });
    });
    if (!claimed) return undefined;
    return this.newLease(claim, bucket, token, now, input);
  }

  /** Take over an unfinished key whose lease is free or expired. */
  private async takeLease(claim: Claim, row: KeyRow, input: I): Promise<AtomicOutcome | Lease<I, D>> {
    const store = this.store;
    const now = store.clock();
    if (row.lease_token && row.lease_until && new Date(row.lease_until).getTime() > now) {
      throw new KeyInFlightError(retryAfter(row.lease_until, now));
    }
    const token = randomUUID();
    const { rows } = await store.db.query<{ recovery_point: string; phase_data: Partial<D> | null }>(
      this.sql.takeLease,
      [
        claim.scope,
        claim.key,
        row.bucket,
        token,
        new Date(now + this.leaseMs).toISOString(),
        new Date(now).toISOString(),
      ],
    );
    const taken = rows[0];
    if (taken) {
      if (row.lease_token) {
        this.onLeaseTakeover?.({ scope: claim.scope, key: claim.key, point: taken.recovery_point });
      }
      return {
        claim,
        bucket: row.bucket,
        token,
        point: taken.recovery_point,
        data: { ...(taken.phase_data ?? {}) } as Partial<D>,
        createdAt: new Date(row.created_at),
        input,
      };
    }
    // Another worker took it, or finished it, between our read and our update.
    const again = await store.lookup(store.db, claim.scope, claim.key, store.clock(), { phases: true });
    if (again) {
      const replay = store.replayOf(claim, again);
      if (replay) return replay;
      throw new KeyInFlightError(retryAfter(again.lease_until, store.clock()));
    }
    throw new KeyInFlightError(1);
  }

  // ---- running the phases --------------------------------------------------------------------------

  private async drive(lease: Lease<I, D>): Promise<AtomicOutcome> {
    const lost = new AbortController();
    const ctx = this.context(lease, lost.signal);
    try {
      await this.crashPoint("after-claim", lease);
      for (;;) {
        const phase = this.phases[lease.point];
        if (!phase) throw new Error(`phases "${this.name}": the key is at "${lease.point}", not a phase`);
        await this.crashPoint("before-phase", lease);
        const outcome =
          "external" in phase
            ? await this.runExternal(phase, lease, ctx, lost)
            : await this.runLocal(phase, lease, ctx);
        if (outcome) return outcome;
      }
    } catch (err) {
      // A crash frees nothing (a dead process cannot); a lost lease is not ours to free.
      if (err instanceof SimulatedCrashError || err instanceof LeaseLostError) throw err;
      // Anything else: free the lease at once, so that the retry need not wait for it to expire. Our own
      // statement, never tied to the client's signal: a hang-up cannot cancel it.
      try {
        await this.store.db.query(this.sql.release, [...this.fence(lease), this.nowIso()]);
      } catch (releaseError) {
        throw new AggregateError([err, releaseError], "the phase failed and freeing its lease failed too");
      }
      if (sqlState(err) === "55P03" || sqlState(err) === "40001" || sqlState(err) === "40P01") {
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
    const stop = this.heartbeat(lease, lost);
    let step: PhaseStep<D> | undefined;
    try {
      step = await phase.external(ctx);
    } catch (err) {
      if (lost.signal.aborted) throw new LeaseLostError();
      throw err;
    } finally {
      stop();
    }
    // The heartbeat saw another token: whatever the call returned, this worker records nothing.
    if (lost.signal.aborted) throw new LeaseLostError();
    await this.crashPoint("after-external", lease);
    if (step?.response) {
      if (!isSaved(step.response.status, this.policy)) {
        await this.store.db.query(this.sql.release, [...this.fence(lease), this.nowIso()]);
        return this.executed(lease, step.response, false);
      }
      const r = await this.store.db.query(this.sql.finish, this.finishParams(lease, step));
      if (r.rowCount !== 1) throw new LeaseLostError();
      return this.executed(lease, step.response, true);
    }
    const next = this.nextOf(lease.point, phase, step);
    const advance = this.asyncRecoveryPoints ? this.sql.advanceAsync : this.sql.advance;
    const r = await this.store.db.query(advance, this.advanceParams(lease, next, step?.data));
    if (r.rowCount !== 1) throw new LeaseLostError();
    lease.point = next;
    Object.assign(lease.data, step?.data);
    return undefined;
  }

  private async runLocal(
    phase: LocalPhase<I, D>,
    lease: Lease<I, D>,
    ctx: PhaseContext<I, D>,
  ): Promise<AtomicOutcome | undefined> {
    let result: { next: string; data: Partial<D> | undefined } | { response: StoredResponse };
    try {
      result = await this.store.db.transaction(
        async (tx) => {
          // The fence: lock our key row only if the token is still ours. A stale worker stops here,
          // before its business writes; a takeover that comes later waits for this commit.
          const locked = await tx.query(this.sql.lock, this.fence(lease));
          if (locked.rows.length === 0) throw new LeaseLostError();
          const step = await phase.local(ctx, tx);
          // The row is locked with our token, so the last write cannot miss: it goes out with COMMIT
          // (one round trip on a pipelining driver), still fenced by the token.
          if (step?.response) {
            if (!isSaved(step.response.status, this.policy)) throw new Unsaved(step.response);
            await this.crashPoint("before-commit", lease);
            tx.final(this.sql.finish, this.finishParams(lease, step));
            return { response: step.response };
          }
          const next = this.nextOf(lease.point, phase, step);
          await this.crashPoint("before-commit", lease);
          tx.final(this.sql.advance, this.advanceParams(lease, next, step?.data));
          return { next, data: step?.data };
        },
        { begin: `SET LOCAL lock_timeout = '${Math.max(1, Math.floor(this.store.lockTimeoutMs))}ms'` },
      );
    } catch (err) {
      if (!(err instanceof Unsaved)) throw err;
      // Not a final answer: the phase's writes rolled back; free the lease and answer this caller only.
      await this.store.db.query(this.sql.release, [...this.fence(lease), this.nowIso()]);
      return this.executed(lease, err.response, false);
    }
    await this.crashPoint("after-commit", lease);
    if ("response" in result) return this.executed(lease, result.response, true);
    lease.point = result.next;
    Object.assign(lease.data, result.data);
    return undefined;
  }

  /**
   * Renew the lease every `heartbeatMs` while an external call runs. A renewal that finds another token
   * aborts `lost`: the phase's result is then not recorded. A renewal that fails (database unreachable)
   * is tried again at the next beat; the fence still guards the write that follows.
   */
  private heartbeat(lease: Lease<I, D>, lost: AbortController): () => void {
    if (!(this.heartbeatMs > 0)) return () => {};
    let busy = false;
    const timer = setInterval(() => {
      if (busy || lost.signal.aborted) return;
      busy = true;
      const until = new Date(this.store.clock() + this.leaseMs).toISOString();
      this.store.db
        .query(this.sql.renew, [...this.fence(lease), until])
        .then(
          (r) => {
            if (r.rowCount === 0) {
              clearInterval(timer);
              lost.abort(new LeaseLostError());
            }
          },
          () => {},
        )
        .finally(() => {
          busy = false;
        });
    }, this.heartbeatMs);
    timer.unref?.();
    return () => clearInterval(timer);
  }

  // ---- helpers -------------------------------------------------------------------------------------

  private context(lease: Lease<I, D>, signal: AbortSignal): PhaseContext<I, D> {
    const { scope, key } = lease.claim;
    return {
      scope,
      key,
      idempotencyKey: `${scope}:${key}`,
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

  private async crashPoint(point: CrashPointName, lease: Lease<I, D>): Promise<void> {
    const faults = this.faults;
    if (faults === undefined) return;
    const info: CrashInfo = { point, phase: lease.point, scope: lease.claim.scope, key: lease.claim.key };
    if (await faults.at(info)) throw new SimulatedCrashError(info);
  }

  private nextOf(point: string, phase: Phase<I, D>, step: PhaseStep<D> | undefined): string {
    const next = step?.next ?? phase.next;
    if (next === undefined) {
      throw new Error(`phases "${this.name}": phase "${point}" returned no response and has no next phase`);
    }
    if (!(next in this.phases)) throw new Error(`phases "${this.name}": "${next}" is not a phase`);
    return next;
  }

  private nowIso(): string {
    return new Date(this.store.clock()).toISOString();
  }

  /** $1..$4 of every fenced statement: the row, and our token. */
  private fence(lease: Lease<I, D>): [string, string, number, string] {
    return [lease.claim.scope, lease.claim.key, lease.bucket, lease.token];
  }

  private advanceParams(lease: Lease<I, D>, next: string, data: Partial<D> | undefined): unknown[] {
    const now = this.store.clock();
    return [
      ...this.fence(lease),
      next,
      JSON.stringify(data ?? {}),
      new Date(now + this.leaseMs).toISOString(), // a fresh lease for the next phase
      new Date(now).toISOString(),
    ];
  }

  private finishParams(lease: Lease<I, D>, step: { response: StoredResponse; data?: Partial<D> }): unknown[] {
    const saved = step.response;
    return [
      ...this.fence(lease),
      saved.status,
      JSON.stringify(filterHeaders(saved.headers, this.replayHeaders)),
      saved.body,
      JSON.stringify(step.data ?? {}),
      this.nowIso(),
    ];
  }

  private executed(lease: Lease<I, D>, response: StoredResponse, saved: boolean): AtomicOutcome {
    return {
      kind: "executed",
      response,
      saved,
      expiresAt: new Date(lease.createdAt.getTime() + this.store.retentionMs),
    };
  }
}

/** Define a phases runner (see the top of this file). */
export function definePhases<I = unknown, D extends Record<string, unknown> = Record<string, unknown>>(
  options: PhasesOptions<I, D>,
): PhasesRunner<I, D> {
  return new PhasesRunner<I, D>(options);
}

function statements(s: string) {
  // $1 scope, $2 key, $3 bucket, $4 our lease token: every write below is fenced by the token.
  const row = "scope = $1 AND key = $2 AND bucket = $3 AND NOT marker";
  const advance = `UPDATE ${s}.keys
                      SET recovery_point = $5, phase_data = coalesce(phase_data, '{}'::jsonb) || $6::text::jsonb,
                          lease_until = $7::timestamptz, updated_at = $8::timestamptz
                    WHERE ${row} AND lease_token = $4::uuid`;
  return {
    // Free, or the holder's lease ran out (by the store's clock). Never a finished row.
    takeLease: `UPDATE ${s}.keys SET lease_token = $4::uuid, lease_until = $5::timestamptz, updated_at = $6::timestamptz
                 WHERE ${row} AND recovery_point <> 'done'
                   AND (lease_until IS NULL OR lease_until <= $6::timestamptz)
             RETURNING recovery_point, phase_data`,
    advance,
    // The same, committed asynchronously (see `asyncRecoveryPoints`): set_config(..., true) is local to
    // this statement's own transaction and is read at its commit, so this costs no extra round trip and
    // leaves the session's setting alone. It runs only for the row that passes the fence.
    advanceAsync: `${advance} AND set_config('synchronous_commit', 'off', true) IS NOT NULL`,
    finish: `UPDATE ${s}.keys
                SET recovery_point = 'done', status = $5, headers = $6::text::jsonb, body = $7,
                    phase_data = coalesce(phase_data, '{}'::jsonb) || $8::text::jsonb,
                    lease_token = NULL, lease_until = NULL, updated_at = $9::timestamptz
              WHERE ${row} AND lease_token = $4::uuid`,
    lock: `SELECT 1 AS held FROM ${s}.keys WHERE ${row} AND lease_token = $4::uuid FOR UPDATE`,
    renew: `UPDATE ${s}.keys SET lease_until = $5::timestamptz WHERE ${row} AND lease_token = $4::uuid`,
    release: `UPDATE ${s}.keys SET lease_token = NULL, lease_until = NULL, updated_at = $5::timestamptz
               WHERE ${row} AND lease_token = $4::uuid`,
  };
}
