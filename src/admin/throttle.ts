/**
 * Failed admin authentications, limited per source: each source (the client's address, as the host
 * says) may fail `failures` times in a row; then every request from it, a right token's included, is
 * answered 429 with `Retry-After` until a failure's worth has refilled (`failures` per `windowMs`), so
 * that nobody can try tokens at the speed of the network. In memory, per process: a cadence, not a
 * decision between instances. At most `MAX_SOURCES` sources are tracked (the oldest forgotten first).
 */

/** Options of the failed-authentication limit (`AdminHandlerOptions.authLimit`). */
export interface AuthLimitOptions {
  /** Failures a source may make before it is refused. Default: 10. */
  failures?: number;
  /** Time in which a source earns back all its failures, in ms. Default: 60,000. */
  windowMs?: number;
}

const MAX_SOURCES = 10_000;

interface Bucket {
  /** Failures left. */
  left: number;
  at: number;
  /** Whether this streak of refusals was reported already. */
  reported: boolean;
}

/** The failures of each source: a token bucket per source. */
export class AuthThrottle {
  readonly #max: number;
  readonly #windowMs: number;
  readonly #sources = new Map<string, Bucket>();

  constructor(options: AuthLimitOptions = {}) {
    this.#max = Math.max(1, Math.floor(options.failures ?? 10));
    this.#windowMs = Math.max(1, options.windowMs ?? 60_000);
  }

  #bucket(source: string, now: number): Bucket | undefined {
    const b = this.#sources.get(source);
    if (!b) return undefined;
    b.left = Math.min(this.#max, b.left + ((now - b.at) * this.#max) / this.#windowMs);
    b.at = now;
    if (b.left >= this.#max) {
      this.#sources.delete(source); // back to full: nothing to remember
      return undefined;
    }
    return b;
  }

  /**
   * Seconds `source` must wait before it may try again, or 0 when it may now. `firstRefusal` is true
   * once per streak of refusals (to record the streak, not every request of it).
   */
  refused(source: string, now = Date.now()): { waitSeconds: number; firstRefusal: boolean } {
    const b = this.#bucket(source, now);
    if (!b || b.left >= 1) return { waitSeconds: 0, firstRefusal: false };
    const firstRefusal = !b.reported;
    b.reported = true;
    return { waitSeconds: Math.ceil(((1 - b.left) * this.#windowMs) / this.#max / 1000), firstRefusal };
  }

  /** Count a failed authentication of `source`. */
  failed(source: string, now = Date.now()): void {
    const b = this.#bucket(source, now) ?? { left: this.#max, at: now, reported: false };
    b.left = Math.max(0, b.left - 1);
    if (b.left >= 1) b.reported = false;
    this.#sources.delete(source);
    this.#sources.set(source, b); // newest last: the first in the map is the oldest
    if (this.#sources.size > MAX_SOURCES) this.#sources.delete(this.#sources.keys().next().value!);
  }
}
