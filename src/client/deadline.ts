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

export class CallDeadline {
  /** Epoch milliseconds at which the call's time is up. */
  readonly at: number;
  readonly totalMs: number;
  readonly caller: AbortSignal | undefined;

  constructor(totalMs: number, caller?: AbortSignal | null) {
    this.totalMs = totalMs;
    this.at = Date.now() + totalMs;
    this.caller = caller ?? undefined;
  }

  /** Milliseconds left (0 once passed). */
  remaining(): number {
    return Math.max(0, this.at - Date.now());
  }

  /** Whether the call must stop now, and why. */
  stopped(): Cut | undefined {
    if (this.caller?.aborted) return Cut.caller;
    if (this.at <= Date.now()) return Cut.deadline;
    return undefined;
  }

  /** A signal for one attempt, aborted by the caller, the deadline or the per-try timeout. */
  attempt(perTryMs: number): AttemptTimer {
    const remaining = this.remaining();
    const byDeadline = !(perTryMs < remaining);
    const ms = byDeadline ? remaining : perTryMs;
    const caller = this.caller;
    if (!Number.isFinite(ms) && !caller) return NO_TIMER;

    const controller = new AbortController();
    let cut: Cut | undefined;
    const timer = Number.isFinite(ms)
      ? setTimeout(() => {
          cut = byDeadline ? Cut.deadline : Cut.perTry;
          controller.abort(
            new DOMException(
              byDeadline ? `Deadline of ${this.totalMs} ms passed` : `Attempt timed out after ${perTryMs} ms`,
              "TimeoutError",
            ),
          );
        }, ms)
      : undefined;
    const onAbort = () => {
      cut = Cut.caller;
      controller.abort(caller?.reason);
    };
    caller?.addEventListener("abort", onAbort, { once: true });
    return {
      signal: controller.signal,
      cut: () => cut,
      done: () => {
        if (timer !== undefined) clearTimeout(timer);
        caller?.removeEventListener("abort", onAbort);
      },
    };
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
