/**
 * `store.inspect(scope, key)`: one key as an operator, a support case or a test sees it, read through
 * the store's API so that nobody needs the keys table's internal columns (`marker`, `bucket`).
 */
import {
  type KeyInspection,
  openHeaders,
  openPhaseData,
  plainLength,
  refsOf,
  SealedValueError,
} from "../../core/index.ts";
import { keyFacts } from "./row.ts";
import { type KeyTable, readLiveKey } from "./table.ts";

interface InspectRow {
  created_at: Date;
  updated_at: Date | null;
  recovery_point: string;
  status: number | null;
  headers: Array<[string, string]> | null;
  body_bytes: number | null;
  /** The body's first bytes: a sealed body's header says how much of it is the reply. */
  body_head: Uint8Array | null;
  fingerprint: Uint8Array;
  lease_token: string | null;
  lease_until: Date | null;
  runner: string | null;
  phase_data: Record<string, unknown> | null;
  needs_review_at: Date | null;
  claim_id: string | null;
}

/** The live key row of (scope, key) in one keys table, or undefined when none (never claimed, or expired). */
export async function inspectKey(
  table: KeyTable,
  scope: string,
  key: string,
): Promise<KeyInspection | undefined> {
  const r = await readLiveKey<InspectRow>(
    table,
    `created_at, updated_at, recovery_point, status, headers, octet_length(body) AS body_bytes,
            substring(body FROM 1 FOR 6) AS body_head,
            fingerprint, lease_token::text AS lease_token, lease_until, runner, phase_data, needs_review_at,
            claim_id::text AS claim_id`,
    scope,
    key,
  );
  if (!r) return undefined;
  const facts = keyFacts(table, r);
  return {
    scope,
    key,
    ref: refsOf(table).encode(scope, key, r.claim_id),
    claimId: facts.claimId,
    state: facts.state,
    recoveryPoint: r.recovery_point,
    createdAt: facts.createdAt,
    expiresAt: facts.expiresAt,
    updatedAt: facts.updatedAt,
    lease: r.lease_token && r.lease_until ? { token: r.lease_token, until: new Date(r.lease_until) } : null,
    fingerprint: Buffer.from(r.fingerprint).toString("hex"),
    saved:
      r.status === null
        ? null
        : {
            status: Number(r.status),
            headers: readableHeaders(table, r.headers, scope, key),
            bodyBytes: plainLength(r.body_head, Number(r.body_bytes ?? 0)),
          },
    runner: r.runner,
    phaseData: readable(
      () => (r.phase_data === null ? null : openPhaseData(table.sealer, r.phase_data, scope, key)),
      null,
    ),
  };
}

/** The saved headers, opened when they are sealed; none shown when this store cannot open them. */
function readableHeaders(
  table: KeyTable,
  stored: unknown,
  scope: string,
  key: string,
): Array<[string, string]> {
  return readable(() => openHeaders(table.sealer, stored, scope, key), []);
}

/** A sealed value opened, or `otherwise` when this store cannot open it. */
function readable<T>(open: () => T, otherwise: T): T {
  try {
    return open();
  } catch (err) {
    if (err instanceof SealedValueError) return otherwise;
    throw err;
  }
}

/** The unfinished keys (claimed, not done, not in review) of one keys table, oldest activity first. */
export async function unfinishedKeys(
  table: KeyTable,
  options: { limit?: number } = {},
): Promise<KeyInspection[]> {
  const t = table.dbTime;
  // Served by the partial index keys_unfinished.
  const { rows } = await table.db.query<{ scope: string; key: string }>(
    `SELECT scope, key FROM ${table.schema}.keys
      WHERE recovery_point <> 'done' AND NOT marker AND needs_review_at IS NULL
        AND bucket >= ${t.oldestBucket} AND created_at > ${t.oldest}
      ORDER BY updated_at LIMIT $1`,
    [Math.max(1, Math.floor(options.limit ?? 100))],
  );
  const out: KeyInspection[] = [];
  for (const r of rows) {
    const k = await inspectKey(table, r.scope, r.key);
    if (k) out.push(k);
  }
  return out;
}
