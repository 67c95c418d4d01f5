import type { OperationRefCodec } from "./operation-ref.ts";
import type { StoredResponse } from "./response.ts";

/** What a request claims: its key within its scope, and the fingerprint of what it asks for. */
export interface Claim {
  /** Whose key it is (the caller's account, from authentication): keys of two scopes never meet. */
  scope: string;
  /** The `Idempotency-Key` as sent. */
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
  /**
   * Compact storage: keep only `save.status` and this id of the created resource (no headers, no body);
   * replays are rebuilt from them by `AtomicRunOptions.rebuild`. Undefined: save `save` in full.
   */
  compactId?: string;
}

/** What a key saved in compact form keeps: the reply's status and the id of the resource it created. */
export interface CompactSaved {
  /** The saved answer's status. */
  status: number;
  /** The id of the resource the first request created (`CompactOptions.id`). */
  id: string;
}

/**
 * Whether the client went away. An `AbortSignal` is one; adapters pass a cheaper object that looks at
 * the socket only when asked (one AbortController per request costs more than the check it serves).
 */
export interface HangUp {
  /** True once the client went away. */
  readonly aborted: boolean;
}

/** Options of one atomic run. */
export interface AtomicRunOptions<Tx> {
  /** The client's hang-up: when it aborted before the commit, nothing is saved. */
  signal?: HangUp;
  /**
   * Rebuilds the reply of a key saved in compact form, inside the replay's transaction (it may read the
   * resource again). Required to replay such a key; the engine passes it for routes with `compact`.
   */
  rebuild?: (saved: CompactSaved, tx: Tx) => Promise<StoredResponse>;
  /**
   * The work's only effects are its statements in `tx` (`LifecycleOptions.effectsInTxOnly`): the store
   * may start it before the key's lookup has answered, so that a pipelining driver sends the work's
   * first statement with the claim, and roll it back if the key turns out to be taken.
   */
  speculate?: boolean;
}

/** How an atomic run ended: this request ran the work, or a saved answer is replayed. */
export type AtomicOutcome =
  /** This request ran the work. `saved` tells whether its response was saved (and its writes committed). */
  (
    | { kind: "executed"; response: StoredResponse; saved: boolean; expiresAt: Date }
    /** A request with this key finished before: its saved answer, byte for byte. */
    | { kind: "replayed"; response: StoredResponse; expiresAt: Date }
  ) & {
    /**
     * The claim the answer belongs to (`keys.claim_id`), when the store knows it: it goes into the
     * answer's operation reference. Absent or null: the reference names the key's live claim.
     */
    claimId?: string | null;
  };

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
  /**
   * How long a duplicate waits for the key's holder before it is answered 409, in milliseconds: with
   * the handler's own time, the route's answer bound (`Idempotency-Answer-Within`). Default: 5,000.
   */
  readonly lockTimeoutMs?: number;
  /**
   * Seals the operation references handed to clients (operation-ref.ts): a secret the store keeps, so
   * that references stay opaque and unforgeable and keep opening after a restart. Default (a store
   * without one): a secret of this process only.
   */
  readonly refs?: OperationRefCodec;
  /** One key as an operator sees it, or undefined when there is none (used before resuming a key). */
  inspect?(scope: string, key: string): Promise<KeyInspection | undefined>;
  /**
   * Claim the key and run `work` in the same transaction: the first request commits its work and its
   * answer together; a retry gets the saved answer without running `work` (see the interface's notes
   * for what it throws).
   */
  atomic(
    claim: Claim,
    work: (tx: Tx) => Promise<WorkResult>,
    options?: AtomicRunOptions<Tx>,
  ): Promise<AtomicOutcome>;
  /**
   * Run work in a plain transaction, for requests without a key on routes where the key is optional.
   * `scope`, when known, lets a store spread over several databases pick the caller's one.
   */
  transaction<T>(work: (tx: Tx) => Promise<T>, options?: { scope?: string }): Promise<T>;
}

/**
 * One key as an operator (or the playground, or a test) sees it: `store.inspect(scope, key)`. Read
 * through the store's API, never by raw SQL on its tables, whose internal columns may change.
 */
export interface KeyInspection {
  /** The key's scope. */
  scope: string;
  /** The key as sent. */
  key: string;
  /** The opaque reference clients receive as `operation_ref` (the store's `refs`: opaque, sealed). */
  ref: string;
  /**
   * This claim of the key (`claim-id.ts`): new each time the key is claimed after it expired; what a
   * phases runner names downstream (`downstreamKey`). Null for a row claimed before claim ids existed.
   */
  claimId: string | null;
  /** `in_progress` (claimed, not finished), `done`, or `needs_review` (outcome unknown, for a person). */
  state: "in_progress" | "done" | "needs_review";
  /** The recovery point (phases mode), `done` when finished. */
  recoveryPoint: string;
  /** When the key was claimed (the database's clock). */
  createdAt: Date;
  /** When the key is forgotten: after it, the same key is new. */
  expiresAt: Date;
  /** The last step recorded (phases mode), else null. */
  updatedAt: Date | null;
  /** The lease (phases mode) when one is held. */
  lease: { token: string; until: Date } | null;
  /** Hex SHA-256 of the request that claimed the key. */
  fingerprint: string;
  /** The saved answer, once there is one. */
  saved: { status: number; headers: Array<[string, string]>; bodyBytes: number } | null;
  /** The phases runner that owns the key (phases mode), else null. */
  runner: string | null;
  /** What earlier phases recorded (phases mode), else null. */
  phaseData: Record<string, unknown> | null;
}
