/**
 * A worker's hold on one key: a random token plus an expiry, renewed by a heartbeat while an external
 * call runs, and the fence (`AND lease_token = mine`) every write carries.
 */

import type { Claim, StoredResponse } from "../../core/index.ts";
import {
  filterHeaders,
  LeaseLostError,
  phaseDataParam,
  sealBytes,
  sealContext,
  sealHeaders,
} from "../../core/index.ts";
import type { KeyTable } from "../keys/table.ts";
import type { FencedSql } from "./sql.ts";

/** This worker's hold on one key. */
export interface Lease<I, D> {
  /** The keys table of the claim's scope. */
  table: KeyTable;
  /** The statements on this key row (its bucket), at the table's current time shift. */
  readonly sql: FencedSql;
  claim: Claim;
  bucket: number;
  /**
   * The key row's claim identity (`keys.claim_id`): new when the key is claimed, the same across
   * retries and takeovers of that claim. Null for a row claimed before sql/0008.
   */
  claimId: string | null;
  token: string;
  point: string;
  data: Partial<D>;
  createdAt: Date;
  /** The key's stored input (the first request's). */
  input: I;
  /** Set when an external call of the current phase may have begun before (sql/0007). */
  attempted: boolean;
  /**
   * Set while this worker's external call of the current phase may have reached the other system and
   * its result is not recorded: freeing the lease then says so in the key's history, and the key can no
   * longer be forgotten as "never started" (key-forget.ts).
   */
  calling?: boolean;
  /**
   * The recovery point an external phase just reached, not written yet: it commits on its own just
   * before the next (local) phase's transaction, on the same connection (`Db.supportsBefore`).
   */
  unrecorded?: { sql: string; params: unknown[] };
}

/**
 * The `Retry-After` (seconds) of a 409 while a worker holds the lease: the time left on the lease, at
 * most MAX_IN_FLIGHT_RETRY_AFTER_S. A live holder usually finishes within a second or two (and renews
 * its lease while it works, so the time left says little about when it ends); a hint as long as the
 * whole lease would make a client with a shorter deadline give up on a double-tap at once. A crashed
 * holder's key is taken over as soon as its lease runs out, which such short retries notice.
 */
export const MAX_IN_FLIGHT_RETRY_AFTER_S = 2;

/** The `Retry-After` for a lease with `leftSeconds` left (as the database's clock measured it). */
export function retryAfter(leftSeconds: number | null | undefined): number {
  return Math.min(MAX_IN_FLIGHT_RETRY_AFTER_S, Math.max(1, Math.ceil(Number(leftSeconds) || 0)));
}

/** $1..$4 of every fenced statement: the row, and our token. */
export function fence(lease: Lease<unknown, unknown>): [string, string, number, string] {
  return [lease.claim.scope, lease.claim.key, lease.bucket, lease.token];
}

/** The parameters of `advance`: the fence, the next phase, the data written, a fresh lease (the database's now plus `leaseMs`). */
export function advanceParams(
  lease: Lease<unknown, unknown>,
  next: string,
  data: object | undefined,
  leaseMs: number,
): unknown[] {
  return [
    ...fence(lease),
    next,
    phaseDataParam(lease.table.sealer, lease.claim, lease.data as object, data),
    leaseMs,
  ];
}

/** The parameters of `finish`: the fence, the saved reply (its allow-listed headers), the data written. */
export function finishParams(
  lease: Lease<unknown, unknown>,
  step: { response: StoredResponse; data?: object },
  replayHeaders: readonly string[],
): unknown[] {
  const { sealer } = lease.table;
  const { scope, key } = lease.claim;
  const saved = step.response;
  return [
    ...fence(lease),
    saved.status,
    sealHeaders(sealer, filterHeaders(saved.headers, replayHeaders), scope, key),
    sealBytes(sealer, saved.body, sealContext(scope, key, "body")),
    phaseDataParam(sealer, lease.claim, lease.data as object, step.data),
  ];
}

/**
 * Free the lease at once (a retry need not wait for it to expire), recording whether this worker's
 * external call may have reached the other system (`lease.calling`).
 */
export async function release(lease: Lease<unknown, unknown>): Promise<void> {
  await lease.table.db.query(lease.calling ? lease.sql.releaseAfterCall : lease.sql.release, fence(lease));
}

/**
 * Renew the lease every `heartbeatMs` until the returned function is called. A renewal that finds
 * another token aborts `lost`: whatever this worker was doing is then not recorded. A renewal that fails
 * (database unreachable) is tried again at the next beat; the fence still guards the write that follows.
 */
export function heartbeat(
  lease: Lease<unknown, unknown>,
  leaseMs: number,
  heartbeatMs: number,
  lost: AbortController,
): () => void {
  if (!(heartbeatMs > 0)) return () => {};
  let busy = false;
  const timer = setInterval(() => {
    if (busy || lost.signal.aborted) return;
    busy = true;
    // The new expiry is the database's now plus the lease (sql.ts), whatever this process's clock says.
    lease.table.db
      .query(lease.sql.renew, [...fence(lease), leaseMs])
      .then(
        (r) => {
          if (r.rowCount === 0) {
            clearInterval(timer);
            lost.abort(new LeaseLostError());
          }
        },
        () => {},
      )
      .finally(() => {
        busy = false;
      });
  }, heartbeatMs);
  timer.unref?.();
  return () => clearInterval(timer);
}
