/**
 * The key row: its type as read back, its state and expiry, and the one place that decides what a row
 * means for a claim (another request's 422, a replay, a review's 409, or "not finished yet"), for
 * every mode.
 */
import {
  type AtomicOutcome,
  type Claim,
  KeyMismatchError,
  type OperationRefCodec,
  OperationUncertainError,
  openReply,
  refsOf,
  type Sealer,
} from "../../core/index.ts";

/** A key row as read back. */
export interface KeyRow {
  /** The partition the row is in: floor(created_at epoch / partition width), sql/0001. */
  bucket: number;
  /** The request's fingerprint (method, path, body), to tell another request under the same key. */
  fingerprint: Uint8Array;
  /** When the key was first claimed. */
  created_at: Date;
  /** Where the work stands: a phase name, or `done`. */
  recovery_point: string;
  /** The saved answer's status; null until there is one. */
  status: number | null;
  /** The saved answer's headers; null until there is one. */
  headers: Array<[string, string]> | null;
  /** The saved answer's body (maybe sealed); null until there is one. */
  body: Uint8Array | null;
  /** The key row's claim identity (sql/0008; null for rows claimed before it). */
  claim_id?: string | null;
  /** Compact storage (atomic-mode lookups only): the created resource's id; `headers` and `body` are NULL. */
  resource_id?: string | null;
  /** Phases mode: the outcome is unknown and waits for a person (`idem keys settle`). */
  needs_review_at?: Date | null;
}

/** The recovery point of a finished key (its reply saved). */
export const RECOVERY_DONE = "done";

/** What building a replay needs of the key's table. */
export interface ReplaySource {
  readonly retentionMs: number;
  readonly sealer?: Sealer | undefined;
  /** Seals the operation reference a key in review is answered with. */
  readonly refs?: OperationRefCodec | undefined;
}

export function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** Whether `row` was claimed by the same request as `claim` (its fingerprint). */
export function sameRequest(claim: Claim, row: KeyRow): boolean {
  const fp = row.fingerprint;
  return sameBytes(fp instanceof Uint8Array ? fp : new Uint8Array(fp), claim.fingerprint);
}

/** Where a key stands: waiting for a person, finished (its reply saved), or in progress. */
export type KeyState = "needs_review" | "done" | "in_progress";

/** The state of a key row: the one place that says it, for the modes, inspection and the operation lookup. */
export function stateOf(row: {
  needs_review_at?: Date | null | undefined;
  recovery_point: string;
  status: number | null;
}): KeyState {
  if (row.needs_review_at) return "needs_review";
  return row.recovery_point === RECOVERY_DONE && row.status !== null ? "done" : "in_progress";
}

/** When a key row expires: its creation (by the database's clock) plus the retention. */
export function expiryOf(table: ReplaySource, row: { created_at: Date }): Date {
  return new Date(new Date(row.created_at).getTime() + table.retentionMs);
}

/**
 * What an existing row means for this claim: `KeyMismatchError` (422) for another request under the
 * key, `OperationUncertainError` (409) for a key in review, the replay of a finished row, or undefined
 * for a row that is not finished yet. The fingerprint is checked first, so a wrong request never gets
 * further (in phases mode: never takes the lease). A row saved in compact form cannot be replayed from
 * the row alone (`CompactWithoutRebuildError`): the atomic runner rebuilds it in a transaction.
 */
export function replayOf(table: ReplaySource, claim: Claim, row: KeyRow): AtomicOutcome | undefined {
  if (!sameRequest(claim, row)) throw new KeyMismatchError();
  const state = stateOf(row);
  if (state === "needs_review")
    throw new OperationUncertainError(refsOf(table).encode(claim.scope, claim.key, row.claim_id));
  if (state !== "done") return undefined;
  if (row.resource_id != null) throw new CompactWithoutRebuildError();
  return {
    kind: "replayed",
    expiresAt: expiryOf(table, row),
    response: openReply(table.sealer, row, claim.scope, claim.key),
    claimId: row.claim_id ?? null,
  };
}

/** What every reader of a key says of it: its claim, state and times (inspection, the operation lookup). */
export function keyFacts(
  table: ReplaySource,
  row: {
    claim_id?: string | null;
    created_at: Date;
    updated_at: Date | null;
    needs_review_at?: Date | null;
    recovery_point: string;
    status: number | null;
  },
): { claimId: string | null; state: KeyState; createdAt: Date; updatedAt: Date | null; expiresAt: Date } {
  return {
    claimId: row.claim_id ?? null,
    state: stateOf(row),
    createdAt: new Date(row.created_at),
    updatedAt: row.updated_at ? new Date(row.updated_at) : null,
    expiresAt: expiryOf(table, row),
  };
}

/** A key saved in compact form was looked up by a route that cannot rebuild its reply. */
export class CompactWithoutRebuildError extends Error {
  /** Always `"CompactWithoutRebuildError"`: the name logs and stack traces show. */
  override name = "CompactWithoutRebuildError";
  constructor() {
    super(
      "this key was saved in compact form (status and resource id): replay it through a route with `compact.rebuild`",
    );
  }
}
