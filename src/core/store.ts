import type { StoredResponse } from "./response.ts";

/** What a request claims: its key within its scope, and the fingerprint of what it asks for. */
export interface Claim {
  scope: string;
  key: string;
  /** SHA-256 of the request (see `fingerprint`). */
  fingerprint: Uint8Array;
}

/** What the work inside an atomic claim produced, and whether it is a final answer to save. */
export interface WorkResult {
  /** The response to send to this caller, as the handler produced it. */
  response: StoredResponse;
  /**
   * What to save and commit for replays (allow-listed headers only), or `undefined` to roll everything
   * back because the answer is not final (a 5xx, a validation failure found late).
   */
  save: StoredResponse | undefined;
}

export type AtomicOutcome =
  /** This request ran the work. `saved` tells whether its response was saved (and its writes committed). */
  | { kind: "executed"; response: StoredResponse; saved: boolean; expiresAt: Date }
  /** A request with this key finished before: its saved response, byte for byte. */
  | { kind: "replayed"; response: StoredResponse; expiresAt: Date };

/**
 * A store that runs work in the same transaction as the key's claim (atomic mode).
 *
 * `atomic` throws `KeyMismatchError` for another fingerprint under the same key, `KeyInFlightError`
 * when the key is held by a request that does not finish in time, and rethrows whatever `work` throws
 * (after rolling back the claim and the work together).
 */
export interface AtomicStore<Tx> {
  /** How long a key is kept, in milliseconds. */
  readonly retentionMs: number;
  atomic(
    claim: Claim,
    work: (tx: Tx) => Promise<WorkResult>,
    options?: { signal?: AbortSignal },
  ): Promise<AtomicOutcome>;
  /** Run work in a plain transaction, for requests without a key on routes where the key is optional. */
  transaction<T>(work: (tx: Tx) => Promise<T>): Promise<T>;
}
