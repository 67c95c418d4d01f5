/**
 * Notes on a key's timeline from outside idem: a business flow that a keyed request started (an order
 * saga, a reconciliation) appends each of its steps to that key's history, in the transaction of the
 * step, so the console's story of the key (key-admin.ts) shows the whole flow where a person looks for
 * it: the request, then each step as it commits. The note goes with the key when its retention ends.
 */
import type { Tx } from "../db.ts";
import { type KeyTable, liveKeyRow, type ShardedKeyTables, tableFor } from "../keys/table.ts";
import { appendEvents } from "../phases/history.ts";

/** A note: what happened (one line for a person), and the step's own fields. */
export interface KeyNote {
  /** A short name of the step, e.g. `stock-reserved`. */
  step: string;
  /** One line for a person. */
  text: string;
  /** Anything else worth keeping (ids, amounts). */
  details?: Record<string, unknown>;
}

/**
 * Append `note` to the timeline of the live key (scope, key), in `tx`. Returns false when there is no
 * live key (never claimed, or expired): nothing is written, and the step goes on regardless.
 */
export async function noteOnKey(
  tx: Tx,
  store: KeyTable | ShardedKeyTables,
  ref: { scope: string; key: string },
  note: KeyNote,
): Promise<boolean> {
  const t = tableFor(store, ref.scope);
  const r = await tx.query(
    `${appendEvents(t.schema)}
     SELECT bucket, claim_id, scope, key, ${t.dbTime.now}, 'note', NULL, $3::text::jsonb
       FROM (SELECT bucket, claim_id, scope, key ${liveKeyRow(t)}) k`,
    [ref.scope, ref.key, JSON.stringify({ ...note.details, step: note.step, text: note.text })],
  );
  return r.rowCount === 1;
}
