/**
 * Circuit breaker: after too many recent attempts failed, stop sending for a while (fail fast),
 * then let a few probe attempts through; a probe that succeeds closes the circuit, one that fails
 * opens it again.
 *
 * What comes from cockatiel and why: deciding *when* to open (failures in a row, or a failure rate
 * over the last N attempts or over a span of time) is the statistically fiddly part, and cockatiel's
 * `ConsecutiveBreaker`, `CountBreaker` and `SamplingBreaker` do it well, are widely used and are tested
 * (the sampling one keeps rotating sub-windows rather than a timestamp per call). We feed them our
 * outcomes through their small `IBreaker` interface. The default is a `SamplingBreaker` (a failure
 * rate over the last 10 s with a minimum volume), not a count in a row: a run of failures that are
 * really one burst of bad luck (many calls failing at the same instant) must not open the circuit,
 * while a server nobody can reach still opens it within a second under any real traffic. Which
 * failures count at all (a lost reply does not) is decided by the attempt loop, via `answer.ts`.
 *
 * What is written here and why: the open / half-open / closed state machine. cockatiel's
 * `CircuitBreakerPolicy` lets exactly one probe through while half-open and makes every other caller
 * *wait* for that probe (ignoring their AbortSignal while they wait), whereas we want callers to fail
 * fast and want a configurable number of probes. It also wraps a function call, while our breaker is
 * consulted per attempt inside a retry loop that classifies HTTP responses itself, and a caller's
 * abort must count neither as a success nor as a failure.
 */
import {
  CircuitState as CockatielState,
  ConsecutiveBreaker,
  CountBreaker,
  type IBreaker,
  SamplingBreaker,
} from "cockatiel";

/** The breaker's states. */
export const CircuitState = { closed: "closed", open: "open", halfOpen: "half-open" } as const;
/** One of the values of {@link CircuitState}. */
export type CircuitState = (typeof CircuitState)[keyof typeof CircuitState];

/** Failure-rate windows: the last `attempts` attempts, or the attempts of the last `ms` milliseconds. */
export type BreakerWindow =
  | {
      /** How many recent attempts the rate is computed over. */
      attempts: number;
      /** Fewest attempts in the window before the rate may open the circuit. Default: `attempts`. */
      minimumAttempts?: number;
    }
  | {
      /** How many milliseconds of recent attempts the rate is computed over. */
      ms: number;
      /**
       * Fewest attempts in the window before the rate may open the circuit (the minimum volume).
       * Default: 5 failures per second's worth, cockatiel's default. Ignored when `minimumRps` is set.
       */
      minimumAttempts?: number;
      /** The same minimum as attempts per second over the window. */
      minimumRps?: number;
    };

/** Options of {@link CircuitBreaker}: when it opens, how long it stays open, what counts as a failure. */
export interface CircuitBreakerOptions {
  /**
   * Open after this many failed attempts in a row, instead of on a rate (used only when
   * `failureRate` is not set). Default: unset (the rate is used).
   */
  consecutiveFailures?: number;
  /**
   * Open when more than this share of the attempts in `window` failed (0 < rate < 1). Default 0.5.
   */
  failureRate?: number;
  /** The window `failureRate` is measured over. Default `{ ms: 10_000, minimumAttempts: 10 }`. */
  window?: BreakerWindow;
  /** How long the circuit stays open before probes are let through. Default 5,000 ms. */
  openMs?: number;
  /** How many probe attempts may be in flight at once while half-open. Default 1. */
  halfOpenProbes?: number;
  /**
   * HTTP statuses that count as failures. Default 500, 502, 503, 504. 408, 409 and 429 come from a
   * server that is up and answering, so by default they count as successes (the retry loop still
   * retries them). Of network errors, a connection refused (or any failure to reach the server) and
   * a per-try timeout count as failures; a reply lost after the request was sent (socket closed,
   * `UND_ERR_SOCKET`/`ECONNRESET`) counts as neither, so many replies lost at once cannot open it.
   */
  failureStatuses?: readonly number[];
  /** Called on every state change. Default: none. */
  onStateChange?: (change: { from: CircuitState; to: CircuitState }) => void;
}

export const DEFAULT_BREAKER_FAILURE_RATE = 0.5;
export const DEFAULT_BREAKER_OPEN_MS = 5_000;
export const DEFAULT_BREAKER_WINDOW: BreakerWindow = Object.freeze({ ms: 10_000, minimumAttempts: 10 });
/** The statuses that count as the server failing, by default: 500, 502, 503, 504. */
export const DEFAULT_FAILURE_STATUSES: readonly number[] = [500, 502, 503, 504];

/** Permission to send one attempt. Report exactly one verdict (later calls are ignored). */
export interface BreakerPermit {
  /** The attempt got an answer from a healthy server. */
  success(): void;
  /** The attempt failed in a way that counts against the server. */
  failure(): void;
  /** The attempt ended with no verdict (e.g. the caller aborted it). */
  release(): void;
}

/**
 * A circuit breaker shared by a client's calls: after too many failures in a row (or too high a rate)
 * it opens and attempts fail at once with `CircuitOpenError`, without being sent; after `openMs` a few
 * probes are let through, and their answers close it or open it again.
 */
export class CircuitBreaker {
  /** The statuses that count as the server failing. */
  readonly failureStatuses: ReadonlySet<number>;
  readonly #strategy: IBreaker;
  readonly #openMs: number;
  readonly #probes: number;
  readonly #onStateChange: CircuitBreakerOptions["onStateChange"];
  #state: CircuitState = CircuitState.closed;
  #openedAt = 0;
  #probesInFlight = 0;
  /** Bumped on every transition, so verdicts of attempts begun in an earlier state are ignored. */
  #generation = 0;

  constructor(options: CircuitBreakerOptions = {}) {
    this.#strategy = strategyFor(options);
    this.#openMs = options.openMs ?? DEFAULT_BREAKER_OPEN_MS;
    this.#probes = Math.max(1, options.halfOpenProbes ?? 1);
    this.failureStatuses = new Set(options.failureStatuses ?? DEFAULT_FAILURE_STATUSES);
    this.#onStateChange = options.onStateChange;
  }

  /** The state now (an open circuit whose wait is over reports half-open). */
  get state(): CircuitState {
    if (this.#state === CircuitState.open && this.retryInMs() === 0) return CircuitState.halfOpen;
    return this.#state;
  }

  /** Milliseconds until an attempt would be let through (0 when closed or half-open). */
  retryInMs(): number {
    if (this.#state !== CircuitState.open) return 0;
    return Math.max(0, this.#openedAt + this.#openMs - Date.now());
  }

  /** A permit for one attempt, or `undefined` when the attempt must not be sent. */
  tryAcquire(): BreakerPermit | undefined {
    if (this.#state === CircuitState.open) {
      if (this.retryInMs() > 0) return undefined;
      this.#transition(CircuitState.halfOpen);
    }
    if (this.#state === CircuitState.halfOpen) {
      if (this.#probesInFlight >= this.#probes) return undefined;
      this.#probesInFlight++;
      return this.#permit(true);
    }
    return this.#permit(false);
  }

  #permit(probe: boolean): BreakerPermit {
    return new Permit(this.#settle, this.#generation, probe);
  }

  /** One attempt's verdict (a bound arrow, made once per breaker, so a permit allocates no closures). */
  readonly #settle = (generation: number, probe: boolean, verdict: Verdict): void => {
    if (generation !== this.#generation) return;
    if (probe) this.#probesInFlight--;
    if (verdict === "none") return;
    if (this.#state === CircuitState.halfOpen) {
      if (verdict === "success") {
        this.#strategy.success(CockatielState.HalfOpen); // resets the window
        this.#transition(CircuitState.closed);
      } else {
        this.#strategy.failure(CockatielState.HalfOpen);
        this.#transition(CircuitState.open);
      }
    } else if (verdict === "success") {
      this.#strategy.success(CockatielState.Closed);
    } else if (this.#strategy.failure(CockatielState.Closed)) {
      this.#transition(CircuitState.open);
    }
  };

  #transition(to: CircuitState): void {
    const from = this.#state;
    if (from === to) return;
    this.#state = to;
    this.#generation++;
    this.#probesInFlight = 0;
    if (to === CircuitState.open) this.#openedAt = Date.now();
    try {
      this.#onStateChange?.({ from, to });
    } catch {
      // A listener's bug must not break the breaker.
    }
  }
}

type Verdict = "success" | "failure" | "none";

/** A permit: the first verdict counts, later ones are ignored. */
class Permit implements BreakerPermit {
  #settled = false;
  readonly #settle: (generation: number, probe: boolean, verdict: Verdict) => void;
  readonly #generation: number;
  readonly #probe: boolean;

  constructor(
    settle: (generation: number, probe: boolean, verdict: Verdict) => void,
    generation: number,
    probe: boolean,
  ) {
    this.#settle = settle;
    this.#generation = generation;
    this.#probe = probe;
  }

  success(): void {
    this.#verdict("success");
  }

  failure(): void {
    this.#verdict("failure");
  }

  release(): void {
    this.#verdict("none");
  }

  #verdict(verdict: Verdict): void {
    if (this.#settled) return;
    this.#settled = true;
    this.#settle(this.#generation, this.#probe, verdict);
  }
}

function strategyFor(options: CircuitBreakerOptions): IBreaker {
  if (options.failureRate === undefined && options.consecutiveFailures !== undefined) {
    return new ConsecutiveBreaker(options.consecutiveFailures);
  }
  const threshold = options.failureRate ?? DEFAULT_BREAKER_FAILURE_RATE;
  const window = options.window ?? DEFAULT_BREAKER_WINDOW;
  if ("ms" in window) {
    const minimumRps =
      window.minimumRps ??
      (window.minimumAttempts !== undefined ? window.minimumAttempts / (window.ms / 1000) : undefined);
    return new SamplingBreaker({
      threshold,
      duration: window.ms,
      ...(minimumRps !== undefined && { minimumRps }),
    });
  }
  return new CountBreaker({
    threshold,
    size: window.attempts,
    ...(window.minimumAttempts !== undefined && { minimumNumberOfCalls: window.minimumAttempts }),
  });
}
