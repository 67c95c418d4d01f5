/**
 * Exponential backoff with full jitter: after attempt n the wait is a uniformly random number of
 * milliseconds in [0, min(capMs, baseMs * 2^n)). The randomness spreads clients that failed together
 * so they do not come back together; the cap keeps a long outage from growing waits without bound.
 */
export interface BackoffOptions {
  /** Ceiling of the first wait is `baseMs * 2` (then 4x, 8x...). Default 200 ms. */
  baseMs?: number;
  /** No wait ceiling grows past this. Default 5,000 ms. */
  capMs?: number;
}

export const DEFAULT_BACKOFF_BASE_MS = 200;
export const DEFAULT_BACKOFF_CAP_MS = 5_000;

/** The ceiling of the wait after attempt `attempt` (1-based). */
export function backoffCeilingMs(attempt: number, options: BackoffOptions = {}): number {
  const base = options.baseMs ?? DEFAULT_BACKOFF_BASE_MS;
  const cap = options.capMs ?? DEFAULT_BACKOFF_CAP_MS;
  // 2 ** 1024 is Infinity, so Math.min keeps this finite for any attempt number.
  return Math.min(cap, base * 2 ** attempt);
}

/** A full-jitter wait after attempt `attempt` (1-based). `random` returns a number in [0, 1). */
export function fullJitterMs(
  attempt: number,
  options: BackoffOptions = {},
  random: () => number = Math.random,
): number {
  return random() * backoffCeilingMs(attempt, options);
}
