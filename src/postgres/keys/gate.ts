/**
 * The key gate: how a request meets its key, the same in every mode (atomic, single-statement, phases).
 * A mode brings one `attempt` at its key (and, when it has one, how a finished key's replay is read
 * without a lock); the gate does the rest:
 *
 *   1. a key this process saw finished (finished-hints.ts) is read first, without a lock: its replay;
 *   2. a duplicate of a call in progress in this process waits behind it in memory (in-flight.ts),
 *      holding no pooled connection: when that call finished the key, every waiter reads the replay
 *      at once (one shared read, shared-reads.ts); otherwise the key is handed to the first waiter;
 *   3. the mode's attempt: the key's answer for this call, "busy" (the key is held elsewhere: another
 *      process's call in progress), or "read" (the key is finished elsewhere: read its replay);
 *   4. busy: sleep without a connection (5 ms, doubling to 100, jittered), read the replay of a key
 *      finished meanwhile, and attempt again, until the bound (`boundMs`, the store's `lockTimeoutMs`):
 *      then 409 with Retry-After (`KeyInFlightError`).
 *
 * Every time the gate compares (a finished key's expiry, how long a duplicate has waited) is the
 * database's, as this process estimates it (`KeyMode.now`, clock.ts): a hint, never a decision; the
 * mode's statements decide. A fourth mode would be one more `KeyMode`.
 */
import { type AtomicOutcome, type Claim, KeyInFlightError } from "../../core/index.ts";
import { FinishedHints } from "./finished-hints.ts";
import { KeysInFlight, keyIdOf } from "./in-flight.ts";

/** How one attempt at a key ended. */
export type Pass<T> =
  /**
   * The key's answer for this call. `finished`: the key is done (its waiters read the replay);
   * `expiresAtMs`: remember it finished until then (a hint: its retry reads it first, without a lock).
   */
  | { kind: "answer"; value: T; finished: boolean; expiresAtMs?: number | undefined }
  /** The key is held elsewhere: sleep without a connection and attempt again, up to the bound. */
  | { kind: "busy" }
  /** The key is finished elsewhere: read its replay without a lock (not answered so: as busy). */
  | { kind: "read" };

/** What a mode brings to the gate: its one attempt, per call `C` (whose `claim` is the key). */
export interface KeyMode<C extends { readonly claim: Claim }, T> {
  /** How long a duplicate waits for the key, in ms, before it is answered 409. */
  boundMs(call: C): number;
  /** This process's estimate of the database's time, epoch ms (the key's table's clock, clock.ts). */
  now(call: C): number;
  /**
   * The answer of a finished key, read without a lock, or undefined (no live row, not finished, or not
   * answerable so). Without it, the attempt reads the key itself (phases mode's claim).
   */
  replay?(call: C, id: string): Promise<AtomicOutcome | undefined>;
  /** One attempt under the key. `waited`: this call waited for another call of the key first. */
  attempt(call: C, waited: boolean): Promise<Pass<T>>;
  /** Past the bound in this process's queue: attempt anyway (the attempt answers at once) instead of 409. */
  readonly attemptPastQueue?: boolean;
  /** Run when the call leaves the gate, before its waiters are woken. */
  leaving?(call: C): Promise<void> | undefined;
}

export class KeyGate<C extends { readonly claim: Claim }, T> {
  /** This process's calls in progress, by (scope, key), and the duplicates waiting behind each. */
  private readonly inFlight = new KeysInFlight();
  /** Keys this process saw finished: a retry of one is read first without a lock (finished-hints.ts). */
  private readonly finished = new FinishedHints();

  constructor(private readonly mode: KeyMode<C, T>) {}

  /** Pass the gate with `call`: the key's answer, or `KeyInFlightError` (409) at the bound. */
  async pass(call: C): Promise<T | AtomicOutcome> {
    const mode = this.mode;
    const id = keyIdOf(call.claim);
    if (mode.replay && this.knownFinished(id, call)) {
      const answer = await this.replay(call, id);
      if (answer) return answer;
    }
    const deadline = mode.now(call) + mode.boundMs(call);
    let waited = false;
    let ours = false;
    while (this.inFlight.has(id)) {
      waited = true;
      const woken = await this.inFlight.wait(id, deadline - mode.now(call));
      if (woken === "timeout") {
        if (mode.attemptPastQueue) break;
        throw new KeyInFlightError(RETRY_AFTER_S);
      }
      if (woken === "yours") {
        ours = true; // handed over: the key is this call's now
        break;
      }
      if (mode.replay) {
        const answer = await this.replay(call, id);
        if (answer) return answer;
      }
    }
    if (!ours) this.inFlight.enter(id);
    let finished = false;
    try {
      for (let pause = 5; ; pause = Math.min(pause * 2, 100)) {
        if (waited && mode.replay) {
          const answer = await this.replay(call, id);
          if (answer) {
            finished = true;
            return answer;
          }
        }
        const pass = await mode.attempt(call, waited);
        if (pass.kind === "answer") {
          finished = pass.finished;
          if (pass.expiresAtMs !== undefined) this.finished.remember(id, pass.expiresAtMs);
          return pass.value;
        }
        if (pass.kind === "read" && mode.replay) {
          // A finished key never changes until it expires: read without the lock. Not answered so (it
          // expired meanwhile): the next attempt, after the pause below, decides.
          const answer = await this.replay(call, id);
          if (answer) {
            finished = true;
            return answer;
          }
        }
        waited = true;
        const left = deadline - mode.now(call);
        if (left <= 0) throw new KeyInFlightError(RETRY_AFTER_S);
        await new Promise((r) => setTimeout(r, Math.min(left, pause * (0.5 + Math.random()))));
      }
    } finally {
      const leaving = mode.leaving?.(call);
      if (leaving) await leaving;
      this.inFlight.leave(id, finished);
    }
  }

  /** Whether this process saw the key finished, unexpired by the database's clock (a hint). */
  private knownFinished(id: string, call: C): boolean {
    const until = this.finished.get(id);
    if (until === undefined) return false;
    if (until > this.mode.now(call)) return true; // a hint: the lookup decides whether it expired
    this.finished.forget(id);
    return false;
  }

  /** The mode's replay without a lock, remembered as finished (or forgotten) for the next retry. */
  private async replay(call: C, id: string): Promise<AtomicOutcome | undefined> {
    const answer = await this.mode.replay!(call, id);
    if (answer) this.finished.remember(id, answer.expiresAt.getTime());
    else this.finished.forget(id);
    return answer;
  }
}

/** The Retry-After of a 409 for a key still in flight. */
const RETRY_AFTER_S = 1;
