/**
 * The store-side read behind the operation lookup (`GET /v1/operations/{ref}`, src/http/operations.ts):
 * the live row of one key, its state and timestamps, and its saved answer opened exactly as a replay
 * opens it. One indexed read of the key's row, like a replay's lookup; no lock, no write.
 */
import { type OperationReader, type OperationRecord, openReply, refsOf } from "../../core/index.ts";
import { keyFacts } from "./row.ts";
import { type KeyTable, readLiveKey, type ShardedKeyTables, tableFor } from "./table.ts";

interface OperationRow {
  created_at: Date;
  updated_at: Date | null;
  recovery_point: string;
  status: number | null;
  headers: unknown;
  body: Uint8Array | null;
  resource_id: string | null;
  needs_review_at: Date | null;
  claim_id: string | null;
}

/**
 * A reader of operations for the lookup handler, over a `PostgresStore` or a `ShardedStore`, with the
 * store's operation references (`refs`), which the handler opens the caller's reference with.
 */
export function operationReader(store: KeyTable | ShardedKeyTables): OperationReader {
  const read = (scope: string, key: string) => readOperation(tableFor(store, scope), scope, key);
  return Object.assign(read, { refs: refsOf(store) });
}

/** The live claim of (scope, key) in one keys table, or undefined. */
export async function readOperation(
  table: KeyTable,
  scope: string,
  key: string,
): Promise<OperationRecord | undefined> {
  // The body is read only once the row is finished (a CASE, so an unfinished row sends none).
  const r = await readLiveKey<OperationRow>(
    table,
    `created_at, updated_at, recovery_point, status, headers,
            CASE WHEN recovery_point = 'done' THEN body END AS body, resource_id, needs_review_at,
            claim_id::text AS claim_id`,
    scope,
    key,
  );
  if (!r) return undefined;
  const facts = keyFacts(table, r);
  const state = facts.state;
  let answer: OperationRecord["answer"] = null;
  if (state === "done") {
    answer =
      r.resource_id != null
        ? { kind: "compact", saved: { status: Number(r.status), id: r.resource_id } }
        : { kind: "reply", response: openReply(table.sealer, r, scope, key) };
  }
  return { ...facts, answer };
}
