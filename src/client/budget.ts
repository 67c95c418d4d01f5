/**
 * A retry budget: a token bucket shared by every call of a client, so that retries can add only a
 * bounded share of extra load (about `ratio`) however many layers and callers fail at once.
 *
 * Every first attempt earns `ratio` tokens (up to `cap`); every retry spends one whole token, and a
 * retry with no token is refused. The bucket starts full, so a quiet client can still ride out a
 * short blip. In a full outage with 1,000 calls that each want 2 retries this allows about
 * cap + 1,000 * ratio = 110 retries (109 in practice: floating point leaves the last token at
 * 0.999...), not 2,000.
 *
 * Hand-written rather than taken from cockatiel: cockatiel 3 has no retry budget (its RetryPolicy
 * counts attempts per call only), and the bucket is ten lines.
 */
export interface RetryBudgetOptions {
  /** Tokens earned by each first attempt. Default 0.1 (retries add at most ~10% load). */
  ratio?: number;
  /** Most tokens the bucket holds, and its starting fill. Default 10. */
  cap?: number;
}

export const DEFAULT_BUDGET_RATIO = 0.1;
export const DEFAULT_BUDGET_CAP = 10;

/**
 * A token bucket shared by a client's calls: each first attempt earns `ratio` tokens, each retry
 * spends one, so retries add at most about `ratio` of the load; a call that finds it empty gives up
 * with `RetryBudgetExhaustedError`.
 */
export class RetryBudget {
  /** Tokens earned by each first attempt. */
  readonly ratio: number;
  /** Most tokens the bucket holds. */
  readonly cap: number;
  #tokens: number;

  constructor(options: RetryBudgetOptions = {}) {
    this.ratio = options.ratio ?? DEFAULT_BUDGET_RATIO;
    this.cap = options.cap ?? DEFAULT_BUDGET_CAP;
    if (!(this.ratio >= 0) || !(this.cap >= 0))
      throw new RangeError("RetryBudget: ratio and cap must be >= 0");
    this.#tokens = this.cap;
  }

  /** Tokens left now. */
  get tokens(): number {
    return this.#tokens;
  }

  /** Record a first attempt (not a retry): earns `ratio` tokens. */
  recordRequest(): void {
    this.#tokens = Math.min(this.cap, this.#tokens + this.ratio);
  }

  /** Take one token for a retry. `false` means the budget is spent and the retry must not happen. */
  tryRetry(): boolean {
    if (this.#tokens < 1) return false;
    this.#tokens -= 1;
    return true;
  }
}
