/**
 * A key's history in phases mode (`<schema>.key_events`, sql/0014): what happened to it, one row per
 * change, for the console's timeline (key-admin.ts). The key row keeps its latest state only.
 *
 * Every change that a phases statement makes appends its event in the same statement (a
 * data-modifying CTE, sql.ts and review.ts): no extra round trip, and the event commits or rolls back
 * with the change it describes. Only what happens off the hot path is written on its own, by the
 * functions below: a provider lookup's outcome and a fenced write refused. Atomic mode records nothing
 * (its claim and saved answer are one transaction).
 *
 * Events are placed by their KEY's bucket (the key row's partition number), so they go with the key's
 * partition when its retention ends (partitions.ts makes and drops both together).
 */
import type { Db } from "../db.ts";
import type { KeyTable } from "../keys/table.ts";

/** What the history needs of a lease (lease.ts's `Lease`; not imported: sql.ts imports this file). */
interface Holder {
  table: KeyTable;
  claim: { scope: string; key: string };
  bucket: number;
  claimId: string | null;
  token: string;
  point: string;
}

/** What an event says happened. */
export type KeyEventKind =
  /** The key was claimed (a new claim id), with the first lease: `token`. */
  | "claimed"
  /** A phase finished and the key moved to the recovery point `details.point`. */
  | "recovery-point"
  /** A free lease was taken (the earlier worker freed it, e.g. its phase failed). */
  | "lease-taken"
  /** An expired lease was taken over: `token` is the new fencing token, `details.replaced` the old. */
  | "takeover"
  /** The worker holding `token` freed its lease (a phase failed, or its answer is not saved). */
  | "lease-released"
  /** An external call of `details.point` may begin (a provider that does not dedup by key). */
  | "call-begun"
  /** A provider lookup: `details.found` is "found", "not-found" or "unknown" (the provider did not answer). */
  | "lookup"
  /** A write by the worker holding `token` was refused by the fence: its lease had been taken over. */
  | "fencing-refused"
  /** The final answer was saved (`details.status`) by the worker holding `token`. */
  | "saved"
  /** A step of a flow the key started (`details.step`, `details.text`), noted from outside (key-notes.ts). */
  | "note";

/** One recorded event of a key. */
export interface KeyEvent {
  at: Date;
  kind: KeyEventKind;
  /** The lease (fencing) token of the worker that wrote it. */
  token: string | null;
  details: Record<string, unknown> | null;
}

/** `INSERT INTO <schema>.key_events (...)`, for a `SELECT` of the events to append. */
export function appendEvents(schema: string): string {
  return `INSERT INTO ${schema}.key_events (bucket, claim_id, scope, key, at, kind, token, details)`;
}

/** Append one event for the key under `lease`, on its own (off the hot path). Never throws. */
async function note(lease: Holder, kind: KeyEventKind, details: Record<string, unknown>): Promise<void> {
  const { table, claim } = lease;
  await table.db
    .query(
      `${appendEvents(table.schema)} VALUES ($1, $2::uuid, $3, $4, ${table.dbTime.now}, $5, $6::uuid, $7::text::jsonb)`,
      [lease.bucket, lease.claimId, claim.scope, claim.key, kind, lease.token, JSON.stringify(details)],
    )
    .catch(() => {}); // the history is for people: it never fails the request
}

/**
 * Record what a provider lookup of the current phase's call found, and pass `found` on (one that could
 * not tell is recorded by the `lookupFailed` statement).
 */
export async function noteLookup<T>(lease: Holder, found: T | undefined): Promise<T | undefined> {
  await note(lease, "lookup", { point: lease.point, found: found === undefined ? "not-found" : "found" });
  return found;
}

/** This worker's write was refused by the fence (`LeaseLostError`): another worker holds the key. */
export function noteFencingRefused(lease: Holder): Promise<void> {
  return note(lease, "fencing-refused", { point: lease.point });
}

/** The recorded events of one claim of a key, oldest first (at most `limit`). */
export async function keyEvents(
  db: Pick<Db, "query">,
  schema: string,
  claim: { scope: string; key: string; claimId: string },
  limit = 1000,
): Promise<KeyEvent[]> {
  const { rows } = await db.query<{ at: Date; kind: KeyEventKind; token: string | null; details: unknown }>(
    `SELECT at, kind, token::text AS token, details FROM ${schema}.key_events
      WHERE claim_id = $1::uuid AND scope = $2 AND key = $3 ORDER BY at LIMIT $4`,
    [claim.claimId, claim.scope, claim.key, limit],
  );
  return rows.map((r) => ({
    at: new Date(r.at),
    kind: r.kind,
    token: r.token,
    details: (r.details as Record<string, unknown> | null) ?? null,
  }));
}
