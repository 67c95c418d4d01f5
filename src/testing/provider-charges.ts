/**
 * The provider simulator's memory of charges and idempotency keys (provider.ts makes the charges).
 * Like a real provider, it forgets: a key and the charge it made are kept `retentionMs` (24 h by
 * default, as Stripe keeps keys), then dropped, so a simulator that runs for months holds the last
 * day's charges, not every charge it ever made. Charges are kept in order of creation from `head` on
 * (those before it have expired), with their times; keys in a Map, whose order is also that of
 * creation: both expire from the front.
 */

/** A charge as the simulator stores and returns it (Stripe-like fields). */
export interface Charge {
  /** The charge's id, e.g. `ch_...`. */
  id: string;
  /** The amount in minor units (cents). */
  amount: number;
  /** ISO 4217 currency, lower case. */
  currency: string;
  /** The card (or token) charged, when one was given. */
  card: string | null;
  /** The `Idempotency-Key` the provider received, or null. */
  idempotency_key: string | null;
  /** The caller's own reference for the payment (searchable), or null. */
  reference: string | null;
  /** Whether it went through or was declined. */
  status: "succeeded" | "failed";
  /** Why it was declined (e.g. `card_declined`); null when it succeeded. */
  failure_code: string | null;
  /** Order of creation, from 1. */
  seq: number;
  /** When it was made (ISO 8601). */
  created: string;
}

/** The answer a key was first given, replayed to its repeats. */
export interface SavedAnswer {
  /** The request's parameters, to tell a repeat from a reuse with others. */
  params: string;
  status: number;
  body: string;
  /** When the key was first used (the simulator's clock). */
  at: number;
}

/** The charges made and the answers saved under their keys, within the retention. */
export class ChargeBook {
  readonly #retentionMs: number;
  readonly #clock: () => number;
  #charges: Charge[] = [];
  #madeAt: number[] = [];
  #head = 0;
  #seq = 0;
  #byKey = new Map<string, SavedAnswer>();

  constructor(retentionMs: number, clock: () => number) {
    if (!(retentionMs > 0)) throw new RangeError(`retentionMs must be a positive number, got ${retentionMs}`);
    this.#retentionMs = retentionMs;
    this.#clock = clock;
  }

  /** Forget the keys and charges past retention. */
  expire(): void {
    const cutoff = this.#clock() - this.#retentionMs;
    while (this.#head < this.#charges.length && this.#madeAt[this.#head]! <= cutoff) this.#head++;
    if (this.#head > 1_024 && this.#head * 2 > this.#charges.length) {
      this.#charges = this.#charges.slice(this.#head);
      this.#madeAt = this.#madeAt.slice(this.#head);
      this.#head = 0;
    }
    for (const [key, saved] of this.#byKey) {
      if (saved.at > cutoff) break;
      this.#byKey.delete(key);
    }
  }

  /** The charges within the retention, in order (call `expire` first). */
  live(): Charge[] {
    return this.#head === 0 ? this.#charges : this.#charges.slice(this.#head);
  }

  /** The answer saved under `key`, if any (call `expire` first). */
  saved(key: string): SavedAnswer | undefined {
    return this.#byKey.get(key);
  }

  /** The next charge's sequence number. */
  nextSeq(): number {
    return ++this.#seq;
  }

  /** Keep `charge`, made now. */
  add(charge: Charge): void {
    this.#charges.push(charge);
    this.#madeAt.push(this.#clock());
  }

  /** Save the answer given to `key`'s first request. */
  save(key: string, params: string, status: number, body: string): void {
    this.#byKey.set(key, { params, status, body, at: this.#clock() });
  }

  /** Forget every charge and key. */
  reset(): void {
    this.#charges = [];
    this.#madeAt = [];
    this.#head = 0;
    this.#seq = 0;
    this.#byKey = new Map();
  }
}
