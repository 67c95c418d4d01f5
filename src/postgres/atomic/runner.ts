/**
 * Atomic mode: the work runs in the transaction that claims its key, and the key row is written with
 * the reply, as the transaction's last statement.
 *
 * Timeline of two duplicates A and B:
 *   A: BEGIN + lock(scope, key) + lookup (nothing)  -> work -> INSERT key row with response + COMMIT
 *   B: BEGIN + lock(scope, key) ... waits for A's transaction to end
 *   A: COMMIT (the lock goes with it)
 *   B: lookup, a new statement with a new snapshot -> sees A's row -> replays A's saved response
 * Had A rolled back, B's lookup would find nothing and B would run the work itself. If A holds the
 * lock past lockTimeoutMs, B answers 409 with Retry-After instead of waiting on.
 *
 * Why a lock rather than claiming with an early INSERT: the keys table is partitioned by time, and
 * PostgreSQL's unique indexes are per partition, so two duplicates on either side of a partition
 * boundary would not meet on one index. The lock is per key whatever the partition (`lockSql`), and the
 * key row is written once, with its response, instead of inserted and then updated. The primary key
 * still backs it up: a duplicate row in one partition fails and rolls the whole transaction back.
 * Claiming with the key row itself was no cheaper for PostgreSQL, and would need boundary markers as
 * phases mode has. The lock and the lookup stay two statements: one statement reads with the snapshot
 * it started with, taken before any wait for the lock, so it could miss the row of the transaction it
 * waited for; a PL/pgSQL function doing both gained nothing worth a function in the schema. The
 * figures: docs/decisions/atomic-lock-and-claim.md.
 *
 * With a pipelining driver the whole path is three round trips: [BEGIN, lock, lookup], the work,
 * and [INSERT key row, COMMIT]. The lock is one prepared statement when the driver takes one with
 * BEGIN, and the key row a plain INSERT unless a row of the key that is not live is in its bucket
 * (`lookupIn`, atomic/sql.ts).
 *
 * Waiting duplicates hold no pooled connection (a hundred duplicates of one slow key would otherwise
 * take the whole pool from every other account): the key gate (keys/gate.ts) queues those of this
 * process in memory and reads a finished key's replay without a lock; across processes, the lock is
 * waited for in the server only briefly (LOCK_WAIT_MS, keys/lock.ts); on 55P03 the transaction ends,
 * the connection goes back, and the attempt says "busy": the gate sleeps and tries again, and answers
 * 409 with Retry-After past `lockTimeoutMs`.
 *
 * Every attempt ends in a value (`Attempt`), given to the gate as a `Pass`; a throw is a real error.
 */
import { randomUUID } from "node:crypto";
import {
  type AtomicOutcome,
  type AtomicRunOptions,
  type Claim,
  isMissingPartition,
  KeyInFlightError,
  RetryableError,
  SqlState,
  type StoredResponse,
  sealBytes,
  sealContext,
  sealHeaders,
  sqlStateOf,
  type WorkResult,
  withGuardedTx,
} from "../../core/index.ts";
import { commit, endTx, rollback, type TxEnd } from "../../core/tx-end.ts";
import { type Db, jsonColumn, type Tx } from "../db.ts";
import { KeyGate, type Pass } from "../keys/gate.ts";
import { type LookupRow, readLiveRow } from "../keys/lookup.ts";
import {
  CompactWithoutRebuildError,
  expiryOf,
  type KeyRow,
  type ReplaySource,
  replayOf,
  sameRequest,
} from "../keys/row.ts";
import { SharedReads } from "../keys/shared-reads.ts";
import { type Speculation, SpeculativeTx } from "./speculative-tx.ts";
import { type AtomicSql, type LockedFound, lockedRowOf } from "./sql.ts";

/** What the runner needs of its store. */
export interface AtomicHost extends ReplaySource {
  readonly db: Db;
  readonly lockTimeoutMs: number;
  /** The statements, with the store's current time shift. */
  readonly sql: AtomicSql;
  /** What serialises every request for one (scope, key), sent with BEGIN (SQL text or one statement). */
  lockSql(scope: string, key: string): string | { sql: string; params: readonly unknown[] };
  /** This process's estimate of the database's time (a hint, never a decision). */
  estimatedNowMs(): number;
  /** Make the partitions of now when this process's hint says they may be missing (undefined: none due). */
  ensureCurrentPartitions(): Promise<void> | undefined;
  /** The key row's partition was missing at the insert: make the partitions again. */
  remakePartitions(): Promise<void>;
}

/** How one locked attempt ended. */
type Attempt =
  /** The key's answer: a replay, or this request's executed work (saved or not). */
  | { kind: "answer"; outcome: AtomicOutcome }
  /** Another transaction held the key's lock past LOCK_WAIT_MS: sleep without a connection, try again. */
  | { kind: "busy" }
  /** The work (or a compact reply's rebuild) threw: everything rolled back, and its error is rethrown. */
  | { kind: "failed"; error: unknown }
  /** The key is finished with a large body (`body_elsewhere`): answered by the lookup without a lock. */
  | { kind: "reread" };

/** The row of the locked lookup (atomic/sql.ts `lockedLookup`): one JSON array. */
interface LockedRow {
  found: LockedFound | string;
}

/** What the locked lookup found. */
interface Looked {
  /** The key's live row (the newest), if any. */
  row: KeyRow | undefined;
  /** When a key saved in this transaction expires. */
  expiresAt: Date;
  /** A row of the key that is not live is in the bucket the key row goes to: it is replaced. */
  replace: boolean;
  /** The live row is finished, with a body too large for the locked lookup to return. */
  reread: boolean;
}

const REREAD: Attempt = { kind: "reread" };

/** One call of `atomic` as it passes the key gate. */
interface AtomicCall {
  readonly claim: Claim;
  readonly work: (tx: Tx) => Promise<WorkResult>;
  readonly options: AtomicRunOptions<Tx>;
  /** A speculative work started once lives on across attempts: its handler cannot be run twice. */
  readonly spec: Speculation;
  /** The partitions of now were made sure of (before the first attempt). */
  prepared: boolean;
}

export class AtomicRunner {
  /** Reads of finished keys in flight: a replay of a key being read joins the read (shared-reads.ts). */
  private readonly reads = new SharedReads<LookupRow | undefined>();
  /** The key gate every call passes (keys/gate.ts): this mode is its attempt. */
  private readonly gate: KeyGate<AtomicCall, AtomicOutcome>;

  constructor(private readonly host: AtomicHost) {
    this.gate = new KeyGate<AtomicCall, AtomicOutcome>({
      boundMs: () => host.lockTimeoutMs,
      now: () => host.estimatedNowMs(),
      replay: (call, id) => this.replayWithoutLock(id, call.claim),
      attempt: (call) => this.pass(call),
      leaving: (call) => this.leaving(call),
    });
  }

  atomic(
    claim: Claim,
    work: (tx: Tx) => Promise<WorkResult>,
    options: AtomicRunOptions<Tx> = {},
  ): Promise<AtomicOutcome> {
    return this.gate.pass({ claim, work, options, spec: {}, prepared: false });
  }

  /** One attempt, as the gate sees it. */
  private async pass(call: AtomicCall): Promise<Pass<AtomicOutcome>> {
    if (!call.prepared) {
      // Past the partitions made so far (no sweep ran lately): make them before the work runs, so the
      // key row has somewhere to go (else the request would be answered 503 after its work had run).
      call.prepared = true;
      const due = this.host.ensureCurrentPartitions();
      if (due) await due;
    }
    const attempt = await this.attempt(call.claim, call.work, call.options, call.spec);
    if (attempt.kind === "failed") throw attempt.error;
    if (attempt.kind === "reread") return { kind: "read" };
    if (attempt.kind === "busy") return attempt;
    const out = attempt.outcome;
    const finished = out.kind === "replayed" || out.saved;
    const remember = finished && !call.options.rebuild;
    return {
      kind: "answer",
      value: out,
      finished,
      expiresAtMs: remember ? out.expiresAt.getTime() : undefined,
    };
  }

  /** The call leaves the gate: a speculative work abandoned while it waited for its key is told first. */
  private leaving(call: AtomicCall): Promise<void> | undefined {
    // Answered otherwise (409, a replay read after a wait, an error) while the work still waited for
    // its key: it has been told, and its adapter's error path ends before the answer is written
    // (bounded: an error handler that never answers must not hold this request).
    if (!call.spec.gate?.abandon()) return undefined;
    return settlesBefore(call.spec.running ?? Promise.resolve(), Date.now() + ABANDON_WAIT_MS).then(() => {});
  }

  /**
   * The answer a finished key gives, read without a lock or a transaction (a done row never changes
   * until it expires): its replay, or `KeyMismatchError` for another request. Undefined when there is
   * no live row, or it is not finished, or it is compact (rebuilt inside a transaction).
   */
  private async replayWithoutLock(id: string, claim: Claim): Promise<AtomicOutcome | undefined> {
    const host = this.host;
    const row = await readLiveRow(this.reads, host.db, host.sql, host.estimatedNowMs(), id, claim);
    return row === undefined || row.resource_id != null ? undefined : replayOf(this.host, claim, row);
  }

  /** One locked attempt (a promise chain, not an async function: one layer fewer per request). */
  private attempt(
    claim: Claim,
    work: (tx: Tx) => Promise<WorkResult>,
    options: AtomicRunOptions<Tx>,
    spec: Speculation,
  ): Promise<Attempt> {
    return endTx(this.host.db, (tx) => this.inTx(tx, claim, work, options, spec), {
      begin: this.host.lockSql(claim.scope, claim.key),
      batch: options.speculate === true,
    }).catch((err: unknown) => this.attemptFailed(err));
  }

  /** What an attempt that threw means: busy (retried), a partition made again (retried by the caller), or the error. */
  private async attemptFailed(err: unknown): Promise<Attempt> {
    // The work's errors are values (`failed`): a lock timeout here is the key's lock's.
    if (sqlStateOf(err) === SqlState.LockNotAvailable) return { kind: "busy" };
    if (isMissingPartition(err)) {
      // The key row's partition went away under this store (a sweep elsewhere with a shorter
      // retention): everything rolled back. The work has run, and an adapter's handler cannot run
      // twice, so the partition is made again (or PartitionMissingError, 503, for a role that may
      // not) and the caller retries: the key is still free.
      await this.host.remakePartitions();
      throw new RetryableError("the key's partition was missing; it has been made again, retry the request", {
        cause: err,
      });
    }
    throw err;
  }

  private async inTx(
    tx: Tx,
    claim: Claim,
    work: (tx: Tx) => Promise<WorkResult>,
    { signal, rebuild, speculate }: AtomicRunOptions<Tx>,
    spec: Speculation,
  ): Promise<TxEnd<Attempt>> {
    const lookup = this.lookupIn(tx, claim);
    let result: WorkResult;
    let expiresAt: Date;
    let replace: boolean;
    if (speculate && tx.pipelined && !rebuild) {
      // The work starts now, and its first statement leaves with BEGIN, the lock and the lookup, in
      // one write. The lookup answers first (statements answer in order), and the work sees its own
      // statement's answer only once the lookup said the key is free.
      //
      // When the key's lock was busy (55P03, the key in flight elsewhere), this transaction was
      // aborted before anything of the work ran; the work is not told, and its waiting statements
      // are sent again in the next attempt's transaction (an adapter cannot run its handler twice).
      let gate = spec.gate;
      let running = spec.running;
      if (gate?.waiting && running) gate.retryOn(tx);
      else {
        gate = spec.gate = new SpeculativeTx(tx);
        // Fenced: what the work keeps past its return fails at once (guarded-tx.ts).
        running = spec.running = withGuardedTx(gate, work);
        running.catch(() => {}); // abandoned below when the key is taken
      }
      let existing: KeyRow | undefined;
      let reread: boolean;
      try {
        ({ row: existing, expiresAt, replace, reread } = await lookup); // a lock timeout (55P03) rejects here: busy, retried
      } catch (err) {
        if (sqlStateOf(err) !== SqlState.LockNotAvailable) gate.abandon();
        throw err;
      }
      if (existing) {
        // The key was taken (or finished) meanwhile: roll the work's statements back, then answer.
        gate.abandon();
        return rollback(reread ? REREAD : await this.answerInTx(claim, existing, tx, undefined));
      }
      gate.free();
      try {
        result = await running;
      } catch (error) {
        return rollback({ kind: "failed", error });
      }
    } else {
      const { row: existing, expiresAt: fresh, replace: here, reread } = await lookup;
      if (existing) {
        if (reread) return rollback(REREAD);
        const answer = await this.answerInTx(claim, existing, tx, rebuild);
        return answer.kind === "failed" ? rollback(answer) : commit(answer);
      }
      expiresAt = fresh;
      replace = here;
      try {
        // Fenced: what the work keeps past its return fails at once (guarded-tx.ts).
        result = await withGuardedTx(tx, work);
      } catch (error) {
        return rollback({ kind: "failed", error });
      }
    }
    // Not saved (the save policy), or the client hung up: roll the work back, answer this caller only.
    if (!result.save || signal?.aborted) return rollback(this.unsaved(result.response));
    const saved = result.save;
    const compact = result.compactId !== undefined;
    const claimId = randomUUID(); // given here, so the answer can name its claim without a read
    // Its bucket and created_at are the database's now (this transaction's start, the instant the
    // lookup read), whatever this process's clock says.
    tx.final(replace ? this.host.sql.replaceDone : this.host.sql.insertDone, [
      claim.scope,
      claim.key,
      claim.fingerprint,
      saved.status,
      compact ? null : sealHeaders(this.host.sealer, saved.headers, claim.scope, claim.key),
      compact ? null : sealBytes(this.host.sealer, saved.body, sealContext(claim.scope, claim.key, "body")),
      compact ? result.compactId : null,
      claimId,
    ]);
    return commit({
      kind: "answer",
      outcome: { kind: "executed", response: result.response, saved: true, expiresAt, claimId },
    });
  }

  private unsaved(response: StoredResponse): Attempt {
    const expiresAt = new Date(this.host.estimatedNowMs());
    return { kind: "answer", outcome: { kind: "executed", response, saved: false, expiresAt } };
  }

  /**
   * The live row of a key, and when a key saved in this transaction expires: the database's now (the
   * transaction's start, which the saved row's created_at will be) plus the retention.
   */
  private lookupIn(tx: Tx, claim: Claim): Promise<Looked> {
    const sql = this.host.sql;
    const params = [claim.scope, claim.key];
    return tx
      .query<LockedRow>(sql.lockedLookupAround(this.host.estimatedNowMs()), params)
      .then(({ rows }) => {
        const found = jsonColumn(rows[0]!.found);
        // The partitions named from this process's estimate of the time miss one the database's clock
        // says a live row may be in: read by that clock alone (same lock, same transaction).
        return found[3] === false
          ? tx
              .query<LockedRow>(sql.lockedLookup, params)
              .then((again) => lookedOf(jsonColumn(again.rows[0]!.found)))
          : lookedOf(found);
      });
  }

  /**
   * What an existing row means for this claim, in the locked transaction: its replay (a row saved in
   * compact form rebuilt through `rebuild`, in this transaction), 422 for another request, or 409 for
   * an unfinished row (thrown: they are the caller's answers, and nothing here is kept).
   */
  private async answerInTx(
    claim: Claim,
    row: KeyRow,
    tx: Tx,
    rebuild: AtomicRunOptions<Tx>["rebuild"],
  ): Promise<Attempt> {
    if (row.resource_id != null && row.status !== null && sameRequest(claim, row)) {
      if (!rebuild) throw new CompactWithoutRebuildError();
      try {
        const response = await rebuild({ status: row.status, id: row.resource_id }, tx);
        return {
          kind: "answer",
          outcome: {
            kind: "replayed",
            expiresAt: expiryOf(this.host, row),
            response,
            claimId: row.claim_id ?? null,
          },
        };
      } catch (error) {
        return { kind: "failed", error };
      }
    }
    const replay = replayOf(this.host, claim, row);
    if (!replay) throw new KeyInFlightError(RETRY_AFTER_S);
    // A done row never changes: its answer is final, and the transaction has nothing left to do.
    tx.readOnlyDone?.();
    return { kind: "answer", outcome: replay };
  }
}

/** What the locked lookup's row says. */
function lookedOf([live, here, newExpiresMs]: LockedFound): Looked {
  const row = live === null ? undefined : lockedRowOf(live);
  // Never replayed from this row (its body is not in it): a live row with a large body is finished.
  const reread = live?.body_elsewhere === true;
  return { row, expiresAt: new Date(newExpiresMs), replace: !row && here, reread };
}

/** Whether `p` settles (either way) before `deadline` (epoch ms). */
function settlesBefore(p: Promise<unknown>, deadline: number): Promise<boolean> {
  const left = deadline - Date.now();
  if (left <= 0) return Promise.resolve(false);
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    p.then(
      () => true,
      () => true,
    ),
    new Promise<boolean>((r) => {
      timer = setTimeout(() => r(false), left);
    }),
  ]).finally(() => clearTimeout(timer));
}

/** How long an abandoned speculative work may take to end before the key's answer is given anyway. */
const ABANDON_WAIT_MS = 1_000;

/** The Retry-After of a 409 for a key still in flight. */
const RETRY_AFTER_S = 1;
