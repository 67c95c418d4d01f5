/**
 * One deadline for a whole call, shared by every attempt and every wait, plus the per-try timeout.
 *
 * Timers are plain `setTimeout`s looked up at call time (not `AbortSignal.timeout`), so fake timers
 * in tests drive them, and they are cleared as soon as the call ends so nothing keeps a process alive.
 * The deadline was hand-written rather than taken from cockatiel: its TimeoutPolicy times one
 * execution, and composing it around a retry policy cannot refuse a wait that would outlast the
 * deadline before it starts; that check needs the time left, which this class exposes.
 */

/** Who cut a call short. */
export const StopCause = { caller: "caller", deadline: "deadline" } as const;
export type StopCause = (typeof StopCause)[keyof typeof StopCause];

export class CallDeadline {
  /** Epoch milliseconds at which the call's time is up. */
  readonly at: number;
  readonly totalMs: number;
  /** Aborted when the deadline passes or the caller's signal fires. */
  readonly signal: AbortSignal;
  #controller = new AbortController();
  #timer: ReturnType<typeof setTimeout> | undefined;
  #stoppedBy: StopCause | undefined;
  #caller: AbortSignal | undefined;
  #onCallerAbort = () => this.#stop(StopCause.caller, this.#caller?.reason);

  constructor(totalMs: number, caller?: AbortSignal | null) {
    this.totalMs = totalMs;
    this.at = Date.now() + totalMs;
    this.signal = this.#controller.signal;
    if (caller) {
      this.#caller = caller;
      if (caller.aborted) this.#stop(StopCause.caller, caller.reason);
      else caller.addEventListener("abort", this.#onCallerAbort, { once: true });
    }
    if (!this.#stoppedBy && Number.isFinite(totalMs)) {
      this.#timer = setTimeout(() => this.#stop(StopCause.deadline), Math.max(0, totalMs));
    }
  }

  /** Milliseconds left (0 once passed). */
  remaining(): number {
    return Math.max(0, this.at - Date.now());
  }

  /** Why the call was stopped, if it was. */
  get stoppedBy(): StopCause | undefined {
    return this.#stoppedBy;
  }

  /** The caller's abort reason, when the caller stopped the call. */
  get callerReason(): unknown {
    return this.#caller?.reason;
  }

  /**
   * A signal for one attempt: aborted by the call (deadline or caller) or after `perTryMs`.
   * `timedOut()` tells a per-try timeout apart from the call being stopped.
   */
  attempt(perTryMs: number): { signal: AbortSignal; timedOut(): boolean; done(): void } {
    if (!(perTryMs < this.remaining())) {
      // The deadline comes first anyway: the call's own signal is enough.
      return { signal: this.signal, timedOut: () => false, done: noop };
    }
    const controller = new AbortController();
    let timedOut = false;
    const forward = () => controller.abort(this.signal.reason);
    this.signal.addEventListener("abort", forward, { once: true });
    const timer = setTimeout(() => {
      timedOut = true;
      controller.abort(new DOMException(`Attempt timed out after ${perTryMs} ms`, "TimeoutError"));
    }, perTryMs);
    return {
      signal: controller.signal,
      timedOut: () => timedOut && !this.#stoppedBy,
      done: () => {
        clearTimeout(timer);
        this.signal.removeEventListener("abort", forward);
      },
    };
  }

  /** Wait `ms`, or reject at once (with the stop reason) when the call is stopped. */
  sleep(ms: number): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.signal.aborted) return reject(this.signal.reason);
      const onAbort = () => {
        clearTimeout(timer);
        reject(this.signal.reason);
      };
      const timer = setTimeout(() => {
        this.signal.removeEventListener("abort", onAbort);
        resolve();
      }, ms);
      this.signal.addEventListener("abort", onAbort, { once: true });
    });
  }

  /** Release the timer and the listener on the caller's signal. Call when the call ends. */
  dispose(): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#caller?.removeEventListener("abort", this.#onCallerAbort);
  }

  #stop(cause: StopCause, reason?: unknown): void {
    if (this.#stoppedBy) return;
    this.#stoppedBy = cause;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#controller.abort(
      cause === StopCause.deadline
        ? new DOMException(`Deadline of ${this.totalMs} ms passed`, "TimeoutError")
        : (reason ?? new DOMException("Aborted", "AbortError")),
    );
  }
}

function noop(): void {}
