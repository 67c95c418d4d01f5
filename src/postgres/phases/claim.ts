/**
 * Taking a key in phases mode: look it up (no lease taken yet), then claim it new, take over its lease,
 * replay it, or refuse.
 *
 *   another fingerprint: 422 (KeyMismatchError), before any lease, so a wrong request never blocks the
 *     real retry; done: replay; in review: 409 operation-uncertain; a live lease: 409 + Retry-After
 *   new key: one committed statement claims it with our lease (random token, expiry from the store's
 *     clock); in the first minutes of a partition, with a boundary marker in the previous partition
 *   unfinished with a free or expired lease: take the lease over and resume at its recovery point,
 *     with the input stored by the key's first request
 */
import { randomUUID } from "node:crypto";
import {
  type AtomicOutcome,
  type Claim,
  encodeOperationRef,
  KeyInFlightError,
  KeyMismatchError,
  OperationUncertainError,
  openBytes,
  openJson,
  RetryableError,
  sealContext,
  sealJson,
} from "../../core/index.ts";
import { RECOVERY_DONE } from "../store.ts";
import { type KeyTable, liveSince, placement, withPartitions } from "./key-table.ts";
import { type Lease, retryAfter } from "./lease.ts";
import { type PhaseRow, type PhaseSql, phaseSql } from "./sql.ts";

/** What the claim needs of the runner. */
export interface ClaimSettings {
  name: string;
  first: string;
  leaseMs: number;
  asyncRecoveryPoints: boolean;
  onLeaseTakeover?: (event: { scope: string; key: string; point: string }) => void;
}

const CONFLICT = Symbol("conflict");

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** The live row of a key, read without taking anything. */
export async function lookupKey(table: KeyTable, scope: string, key: string): Promise<PhaseRow | undefined> {
  const since = liveSince(table, table.clock());
  const { rows } = await table.db.query<PhaseRow>(phaseSql(table.schema).lookup, [
    scope,
    key,
    since.iso,
    since.bucket,
  ]);
  return rows[0];
}

/**
 * What an existing row means for this claim: 422 for another request, the replay of a finished row,
 * 409 operation-uncertain for a row in review, or undefined for an unfinished one.
 */
export function answerOf(table: KeyTable, claim: Claim, row: PhaseRow): AtomicOutcome | undefined {
  if (!sameBytes(new Uint8Array(row.fingerprint), claim.fingerprint)) throw new KeyMismatchError();
  if (row.needs_review_at) throw new OperationUncertainError(encodeOperationRef(claim.scope, claim.key));
  if (row.recovery_point !== RECOVERY_DONE || row.status === null) return undefined;
  return {
    kind: "replayed",
    expiresAt: new Date(new Date(row.created_at).getTime() + table.retentionMs),
    response: {
      status: row.status,
      headers: row.headers ?? [],
      body: openBytes(
        table.sealer,
        row.body ?? new Uint8Array(),
        sealContext(claim.scope, claim.key, "body"),
      ),
    },
  };
}

export async function acquire<I, D>(
  s: ClaimSettings,
  table: KeyTable,
  claim: Claim,
  input: I,
  signal: AbortSignal | undefined,
): Promise<AtomicOutcome | Lease<I, D>> {
  const sql = phaseSql(table.schema);
  let row: PhaseRow | undefined;
  const now = table.clock();
  const { bucket, marker } = placement(table, now, true);
  if (!marker && !signal?.aborted) {
    // The common case in one round trip: look the key up and, if it is new, claim it with our lease.
    const token = randomUUID();
    const since = liveSince(table, now);
    const params = [...claimParams(s, table, claim, bucket, token, now, input), since.bucket];
    const { rows } = await withPartitions(table, () =>
      table.db.query<PhaseRow & { claimed: number; found: boolean }>(
        s.asyncRecoveryPoints ? sql.lookupOrClaimAsync : sql.lookupOrClaim,
        params,
      ),
    );
    const got = rows[0]!;
    if (Number(got.claimed) === 1) return newLease(table, sql, claim, bucket, token, now, input, s.first);
    row = got.found ? got : await lookupKey(table, claim.scope, claim.key);
  } else {
    row = await lookupKey(table, claim.scope, claim.key);
  }
  let withMarker = true;
  for (let attempt = 0; ; attempt++) {
    if (row) {
      // Body check BEFORE the lease: a wrong request must not block the real retry for a lease's length.
      const replay = answerOf(table, claim, row);
      if (replay) return replay;
      return takeLease(s, table, sql, claim, row, input);
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

/** $1..$11 of the claim statements. */
function claimParams<I>(
  s: ClaimSettings,
  table: KeyTable,
  claim: Claim,
  bucket: number,
  token: string,
  now: number,
  input: I,
): unknown[] {
  return [
    bucket,
    claim.scope,
    claim.key,
    claim.fingerprint,
    new Date(now).toISOString(),
    s.first,
    token,
    new Date(now + s.leaseMs).toISOString(),
    s.name,
    JSON.stringify(sealJson(table.sealer, input, sealContext(claim.scope, claim.key, "request"))),
    liveSince(table, now).iso,
  ];
}

function newLease<I, D>(
  table: KeyTable,
  sql: PhaseSql,
  claim: Claim,
  bucket: number,
  token: string,
  now: number,
  input: I,
  point: string,
): Lease<I, D> {
  return {
    table,
    sql,
    claim,
    bucket,
    token,
    point,
    data: {},
    createdAt: new Date(now),
    input,
    attempted: false,
  };
}

/**
 * Insert the key row with our lease, committed at once; with a boundary marker, both rows go in
 * together or not at all. Undefined when someone else's live row is there.
 */
async function claimNew<I, D>(
  s: ClaimSettings,
  table: KeyTable,
  sql: PhaseSql,
  claim: Claim,
  input: I,
  withMarker: boolean,
): Promise<Lease<I, D> | undefined> {
  const now = table.clock();
  const { bucket, marker } = placement(table, now, withMarker);
  const token = randomUUID();
  const params = claimParams(s, table, claim, bucket, token, now, input);
  const claimed = await withPartitions(table, async () => {
    if (!marker) return (await table.db.query(sql.claim, params)).rows.length === 1;
    return table.db
      .transaction(async (tx) => {
        const r = await tx.query(sql.claimWithMarker, [...params, bucket - 1]);
        if (r.rows.length !== 2) throw CONFLICT;
        return true;
      })
      .catch((err) => {
        if (err === CONFLICT) return false;
        throw err;
      });
  });
  return claimed ? newLease(table, sql, claim, bucket, token, now, input, s.first) : undefined;
}

/** Take over an unfinished key whose lease is free or expired. */
async function takeLease<I, D>(
  s: ClaimSettings,
  table: KeyTable,
  sql: PhaseSql,
  claim: Claim,
  row: PhaseRow,
  input: I,
): Promise<AtomicOutcome | Lease<I, D>> {
  const now = table.clock();
  if (row.lease_token && row.lease_until && new Date(row.lease_until).getTime() > now) {
    throw new KeyInFlightError(retryAfter(row.lease_until, now));
  }
  // Open the stored input BEFORE taking the lease: one that cannot be opened (a dropped key, an altered
  // value) fails this request without leaving a lease nobody holds.
  const context = sealContext(claim.scope, claim.key, "request");
  const stored = openJson(table.sealer, row.request, context);
  const token = randomUUID();
  const { rows } = await table.db.query<
    Pick<PhaseRow, "recovery_point" | "phase_data" | "request" | "attempted_at">
  >(sql.takeLease, [
    claim.scope,
    claim.key,
    row.bucket,
    token,
    new Date(now + s.leaseMs).toISOString(),
    new Date(now).toISOString(),
  ]);
  const taken = rows[0];
  if (taken) {
    if (row.lease_token) {
      s.onLeaseTakeover?.({ scope: claim.scope, key: claim.key, point: taken.recovery_point });
    }
    return {
      table,
      sql,
      claim,
      bucket: row.bucket,
      token,
      point: taken.recovery_point,
      data: { ...(taken.phase_data ?? {}) } as Partial<D>,
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
    const replay = answerOf(table, claim, again);
    if (replay) return replay;
    throw new KeyInFlightError(retryAfter(again.lease_until, table.clock()));
  }
  throw new KeyInFlightError(1);
}
