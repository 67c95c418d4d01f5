/**
 * Taking a key in phases mode: look it up (no lease taken yet), then claim it new, take over its lease,
 * replay it, or refuse.
 *
 *   another fingerprint: 422 (KeyMismatchError), before any lease, so a wrong request never blocks the
 *     real retry; done: replay; in review: 409 operation-uncertain; a live lease: 409 + Retry-After
 *   new key: one committed statement claims it with our lease (random token, expiry from the database's
 *     clock, like every time this file compares); in the first minutes of a partition, with a boundary
 *     marker in the previous partition
 *   unfinished with a free or expired lease: take the lease over and resume at its recovery point,
 *     with the input stored by the key's first request
 */
import { randomUUID } from "node:crypto";
import {
  type AtomicOutcome,
  type Claim,
  KeyInFlightError,
  openJson,
  openPhaseData,
  RetryableError,
  sealContext,
  sealJson,
} from "../../core/index.ts";
import { leaseTakenOver } from "../../core/observe.ts";
import { commit, endTx, rollback } from "../../core/tx-end.ts";
import { replayOf } from "../keys/row.ts";
import { type KeyTable, withPartitions } from "../keys/table.ts";
import { uuidv7 } from "../uuid7.ts";
import { type Lease, retryAfter } from "./lease.ts";
import { fencedSql, type PhaseRow, type PhaseSql, phaseSql } from "./sql.ts";

/** What the claim needs of the runner. */
export interface ClaimSettings {
  name: string;
  first: string;
  leaseMs: number;
  asyncRecoveryPoints: boolean;
  onLeaseTakeover?: (event: { scope: string; key: string; point: string }) => void;
}

/** The live row of a key, read without taking anything. */
export async function lookupKey(table: KeyTable, scope: string, key: string): Promise<PhaseRow | undefined> {
  const { rows } = await table.db.query<PhaseRow>(phaseSql(table).lookup, [scope, key]);
  return rows[0];
}

/** What the lookup-or-claim statements return: the live row's columns (null when none), and the claim. */
type LookedOrClaimed = PhaseRow & {
  found: boolean;
  needs_marker: boolean;
  claimed_bucket: number | null;
  claimed_at: Date | null;
  claimed_id: string | null;
  /** `lookupOrClaimAround` only: whether its partitions hold every one a live row may be in. */
  covered?: boolean;
};

/** What a claim statement returns about the row it inserted. */
interface Claimed {
  bucket: number;
  created_at: Date;
  claim_id: string;
}

export async function acquire<I, D>(
  s: ClaimSettings,
  table: KeyTable,
  claim: Claim,
  input: I,
  signal: AbortSignal | undefined,
  /** Read the key first (a duplicate that waited for this process's claim of it): claim only if absent. */
  readFirst = false,
): Promise<AtomicOutcome | Lease<I, D>> {
  const sql = phaseSql(table);
  let row: PhaseRow | undefined = readFirst ? await lookupKey(table, claim.scope, claim.key) : undefined;
  // Found: answered below (a replay, 422, or the lease) without the claim statement.
  if (!row && !signal?.aborted) {
    // The common case in one round trip: look the key up and, if it is new (and no boundary marker is
    // due: the database's now decides), claim it with our lease.
    const token = randomUUID();
    const params = claimParams(s, table, claim, token, input);
    const lookupOrClaim = (text: string) =>
      withPartitions(table, () => table.db.query<LookedOrClaimed>(text, params)).then(({ rows }) => rows[0]!);
    const byDbClock = s.asyncRecoveryPoints ? sql.lookupOrClaimAsync : sql.lookupOrClaim;
    const estimated = table.estimatedNowMs?.();
    let read = await lookupOrClaim(
      estimated === undefined ? byDbClock : sql.lookupOrClaimAround(estimated, s.asyncRecoveryPoints),
    );
    // The partitions named from the estimate miss one the database's clock says a live row may be in
    // (nothing was claimed): look up and claim by that clock alone.
    if (read.covered === false) read = await lookupOrClaim(byDbClock);
    if (read.claimed_bucket !== null && read.claimed_bucket !== undefined) {
      const claimed = {
        bucket: read.claimed_bucket,
        created_at: read.claimed_at!,
        claim_id: read.claimed_id!,
      };
      return newLease(table, claim, claimed, token, input, s.first);
    }
    // Not claimed: a live row is there, or a boundary marker is due (claimNew below), or a concurrent
    // claim won the insert (read what it wrote).
    row = read.found ? read : read.needs_marker ? undefined : await lookupKey(table, claim.scope, claim.key);
  } else if (!row) {
    row = await lookupKey(table, claim.scope, claim.key);
  }
  let withMarker = true;
  for (let attempt = 0; ; attempt++) {
    if (row) {
      // Body check BEFORE the lease: a wrong request must not block the real retry for a lease's length.
      const replay = replayOf(table, claim, row);
      if (replay) return replay;
      return takeLease(s, table, claim, row, input);
    }
    if (signal?.aborted) {
      throw new RetryableError("The client went away before the key was claimed; nothing was done.");
    }
    const lease = await claimNew(s, table, sql, claim, input, withMarker);
    if (lease) return lease;
    // Someone claimed it first (or a live row blocked our boundary marker): read what is there.
    row = await lookupKey(table, claim.scope, claim.key);
    if (!row) {
      if (attempt >= 2) throw new KeyInFlightError(1);
      withMarker = false;
    }
  }
}

/**
 * $1..$9 of the claim statements. The claim id ($9) is a UUIDv7 from this process, not the column's
 * random default: every event of the key's history is indexed by it (`key_events (claim_id, at)`), and
 * time-ordered ids append at the index's right edge, where random ones write all over a day's
 * partition (its pages read back and logged whole after each checkpoint once it outgrows the cache).
 * Only uniqueness matters to what the id does; a process whose clock is off only moves where its ids
 * land in the index.
 */
function claimParams<I>(s: ClaimSettings, table: KeyTable, claim: Claim, token: string, input: I): unknown[] {
  return [
    claim.scope,
    claim.key,
    claim.fingerprint,
    s.first,
    token,
    s.leaseMs,
    s.name,
    JSON.stringify(sealJson(table.sealer, input, sealContext(claim.scope, claim.key, "request"))),
    uuidv7(),
  ];
}

function newLease<I, D>(
  table: KeyTable,
  claim: Claim,
  claimed: Claimed,
  token: string,
  input: I,
  point: string,
): Lease<I, D> {
  return {
    table,
    get sql() {
      return fencedSql(table, this.bucket);
    },
    claim,
    bucket: Number(claimed.bucket),
    claimId: claimed.claim_id,
    token,
    point,
    data: {},
    createdAt: new Date(claimed.created_at),
    input,
    attempted: false,
  };
}

/**
 * Insert the key row with our lease, committed at once; with a boundary marker (when the database's
 * now is in the first minutes of a partition), both rows go in together or not at all. Undefined when
 * someone else's live row is there.
 */
async function claimNew<I, D>(
  s: ClaimSettings,
  table: KeyTable,
  sql: PhaseSql,
  claim: Claim,
  input: I,
  withMarker: boolean,
): Promise<Lease<I, D> | undefined> {
  const token = randomUUID();
  const params = [...claimParams(s, table, claim, token, input), withMarker];
  const claimed = await withPartitions(table, () =>
    endTx(table.db, async (tx) => {
      const r = await tx.query<Claimed & { inserted: number; wanted_marker: boolean }>(sql.claim, params);
      const inserted = r.rows[0]!;
      // Fewer rows than wanted: someone's row is there; roll back (a marker alone must not stay).
      return Number(inserted.inserted) === (inserted.wanted_marker ? 2 : 1)
        ? commit(inserted)
        : rollback(undefined);
    }),
  );
  return claimed ? newLease(table, claim, claimed, token, input, s.first) : undefined;
}

/** Take over an unfinished key whose lease is free or expired (by the database's clock). */
async function takeLease<I, D>(
  s: ClaimSettings,
  table: KeyTable,
  claim: Claim,
  row: PhaseRow,
  input: I,
): Promise<AtomicOutcome | Lease<I, D>> {
  if (row.lease_token && Number(row.lease_left_s) > 0) {
    throw new KeyInFlightError(retryAfter(row.lease_left_s), row.claim_id);
  }
  // Open the stored input BEFORE taking the lease: one that cannot be opened (a dropped key, an altered
  // value) fails this request without leaving a lease nobody holds.
  const context = sealContext(claim.scope, claim.key, "request");
  const stored = openJson(table.sealer, row.request, context);
  const token = randomUUID();
  const bucket = Number(row.bucket);
  // The statement takes the lease only if it is free or expired by the database's clock: the check
  // above is a shortcut, this is the decision.
  const { rows } = await table.db.query<
    Pick<PhaseRow, "recovery_point" | "phase_data" | "request" | "attempted_at">
  >(fencedSql(table, bucket).takeLease, [claim.scope, claim.key, bucket, token, s.leaseMs]);
  const taken = rows[0];
  if (taken) {
    if (row.lease_token) {
      s.onLeaseTakeover?.({ scope: claim.scope, key: claim.key, point: taken.recovery_point });
      leaseTakenOver(taken.recovery_point);
    }
    return {
      table,
      get sql() {
        return fencedSql(table, bucket);
      },
      claim,
      bucket,
      claimId: row.claim_id ?? null,
      token,
      point: taken.recovery_point,
      data: openPhaseData(table.sealer, taken.phase_data, claim.scope, claim.key) as Partial<D>,
      createdAt: new Date(row.created_at),
      // The first request's input, never this one's: equal fingerprints need not mean equal inputs.
      input:
        taken.request === null || taken.request === undefined
          ? input
          : ((taken.request === row.request ? stored : openJson(table.sealer, taken.request, context)) as I),
      attempted: taken.attempted_at !== null,
    };
  }
  // Another worker took it, finished it or sent it to review between our read and our update.
  const again = await lookupKey(table, claim.scope, claim.key);
  if (again) {
    const replay = replayOf(table, claim, again);
    if (replay) return replay;
    throw new KeyInFlightError(retryAfter(again.lease_left_s), again.claim_id);
  }
  throw new KeyInFlightError(1);
}
