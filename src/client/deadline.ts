/**
 * One deadline for a whole call, shared by every attempt and every wait, plus the per-try timeout.
 *
 * There is no timer for the call as a whole: each attempt gets one timer, set to whichever comes
 * first of its per-try timeout and the deadline, and a wait is never started unless it ends before
 * the deadline, so only the caller's signal can cut a wait short. That keeps the success path to one
 * AbortController and one timer. Timers are plain `setTimeout`s looked up at call time (not
 * `AbortSignal.timeout`), so fake timers in tests drive them.
 *
 * The deadline is hand-written rather than taken from cockatiel: its TimeoutPolicy times one
 * execution, and wrapping it around a retry policy cannot refuse a wait that would outlast the
 * deadline before the wait starts; that check needs the time left, which this class exposes.
 */

/** Why an attempt was cut short. */
export const Cut = {
  /** The caller's AbortSignal fired. */
  caller: "caller",
  /** The call's deadline passed. */
  deadline: "deadline",
  /** This attempt's per-try timeout passed (the call goes on). */
  perTry: "per-try",
} as const;
/** One of the values of {@link Cut}. */
export type Cut = (typeof Cut)[keyof typeof Cut];

export interface AttemptTimer {
  /** The signal to give `fetch` (undefined when nothing can cut the attempt short). */
  readonly signal: AbortSignal | undefined;
  /** Why the attempt was cut, if it was. */
  cut(): Cut | undefined;
  /** Clear the timer and the listener. Call once the response headers (or an error) arrived. */
  done(): void;
}

const NO_TIMER: AttemptTimer = { signal: undefined, cut: () => undefined, done() {} };

/**
 * One attempt's controller and timer. A class rather than closures, so that an attempt costs one
 * object, one AbortController and one timer (plus a listener only when the caller gave a signal).
 */
class Attempt implements AttemptTimer {
  readonly signal: AbortSignal;
  readonly #controller: AbortController;
  readonly #deadline: CallDeadline;
  readonly #perTryMs: number;
  readonly #byDeadline: boolean;
  readonly #timer: ReturnType<typeof setTimeout> | undefined;
  readonly #onAbort: (() => void) | undefined;
  #cut: Cut | undefined;

  constructor(deadline: CallDeadline, ms: number, perTryMs: number, byDeadline: boolean) {
    const controller = new AbortController();
    this.#controller = controller;
    this.signal = controller.signal;
    this.#deadline = deadline;
    this.#perTryMs = perTryMs;
    this.#byDeadline = byDeadline;
    // The attempt is passed as the timer's argument: no closure per attempt.
    this.#timer = Number.isFinite(ms) ? setTimeout(timeOut, ms, this) : undefined;
    const caller = deadline.caller;
    if (caller) {
      this.#onAbort = () => {
        this.#cut = Cut.caller;
        controller.abort(caller.reason);
      };
      caller.addEventListener("abort", this.#onAbort, { once: true });
    }
  }

  cut(): Cut | undefined {
    return this.#cut;
  }

  done(): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    if (this.#onAbort) this.#deadline.caller?.removeEventListener("abort", this.#onAbort);
  }

  /** The timer fired: the per-try timeout or the deadline, whichever was set. */
  timeOut(): void {
    const byDeadline = this.#byDeadline;
    this.#cut = byDeadline ? Cut.deadline : Cut.perTry;
    this.#controller.abort(
      new DOMException(
        byDeadline
          ? `Deadline of ${this.#deadline.totalMs} ms passed`
          : `Attempt timed out after ${this.#perTryMs} ms`,
        "TimeoutError",
      ),
    );
  }
}

function timeOut(attempt: Attempt): void {
  attempt.timeOut();
}

export class CallDeadline {
  /** Epoch milliseconds at which the call's time is up. */
  readonly at: number;
  readonly totalMs: number;
  readonly caller: AbortSignal | undefined;

  /** `now` (epoch ms) saves a clock read when the caller has just read it. */
  constructor(totalMs: number, caller?: AbortSignal | null, now: number = Date.now()) {
    this.totalMs = totalMs;
    this.at = now + totalMs;
    this.caller = caller ?? undefined;
  }

  /** Milliseconds left (0 once passed). */
  remaining(now: number = Date.now()): number {
    return Math.max(0, this.at - now);
  }

  /** Whether the call must stop now, and why. */
  stopped(now?: number): Cut | undefined {
    if (this.caller?.aborted) return Cut.caller;
    if (this.at <= (now ?? Date.now())) return Cut.deadline;
    return undefined;
  }

  /** A signal for one attempt, aborted by the caller, the deadline or the per-try timeout. */
  attempt(perTryMs: number, now?: number): AttemptTimer {
    const remaining = this.remaining(now);
    const byDeadline = !(perTryMs < remaining);
    const ms = byDeadline ? remaining : perTryMs;
    if (!Number.isFinite(ms) && !this.caller) return NO_TIMER;
    return new Attempt(this, ms, perTryMs, byDeadline);
  }

  /**
   * Wait `ms` (the caller checked that it ends before the deadline), or reject at once with the
   * caller's abort reason when the caller's signal fires.
   */
  sleep(ms: number): Promise<void> {
    const caller = this.caller;
    return new Promise((resolve, reject) => {
      if (caller?.aborted) return reject(caller.reason);
      const onAbort = () => {
        clearTimeout(timer);
        reject(caller?.reason);
      };
      const timer = setTimeout(() => {
        caller?.removeEventListener("abort", onAbort);
        resolve();
      }, ms);
      caller?.addEventListener("abort", onAbort, { once: true });
    });
  }
}
