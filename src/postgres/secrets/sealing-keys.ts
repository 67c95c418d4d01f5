/**
 * Which key new values are sealed with, decided in the database so that a rolling rotation cannot
 * seal with a key some instance cannot open (sql/0009_sealing_keys.sql).
 *
 * Each store with a keyed sealer (`AesGcmSealer`) registers this instance as a reader: the key ids it
 * opens, `seen_at` by the database's clock, refreshed every few seconds while it seals or opens. It
 * seals with the key `sealing_key` records as promoted (the first instance to open records its own
 * first key), never merely with the first key of its own list. `promoteSealingKey` records a new key
 * only when every live reader (seen in the last minute, by the database's clock) opens it, in one
 * statement. So the two-step rollout is enforced, not just documented:
 *
 *   1. roll out the new key in every instance's list (first or not: it only opens until promoted);
 *   2. `idem keys promote k2`: refused, naming the instances, while one still lacks k2;
 *   3. each instance seals with k2 from its next refresh (until then with k1, which all open).
 */
import { randomUUID } from "node:crypto";
import type { KeyedSealer, Sealer } from "../../core/index.ts";
import type { Db } from "../db.ts";

/** How often an instance re-reads the promoted key and says it is alive (process clock: a cadence only). */
export const SEALING_REFRESH_MS = 5_000;
/** A reader not seen for this long (database clock) no longer holds a promotion back. */
export const SEALING_READER_LIVE_MS = 60_000;

/** A promotion refused: some live instance cannot open the key yet. */
export class SealingKeyPromotionError extends Error {
  /** Always `"SealingKeyPromotionError"`: the name logs and stack traces show. */
  override name = "SealingKeyPromotionError";
  /** Always `"sealing_key_not_everywhere"`: a code to check that does not depend on the class. */
  readonly code = "sealing_key_not_everywhere";
}

/**
 * The store's sealer: opens with every configured key, seals with the promoted one (when configured
 * here; else with this instance's first key, which the others opened before it was ever replaced).
 */
export class PromotedSealer implements Sealer {
  /** This instance's reader id (a random UUID per store). */
  readonly instance = randomUUID();
  private promoted: string | undefined;
  private checkedAt = 0;
  private refreshing: Promise<void> | undefined;

  constructor(
    private readonly db: Db,
    private readonly schema: string,
    readonly inner: KeyedSealer,
  ) {}

  /** The key new values are sealed with now. */
  get sealingId(): string {
    const p = this.promoted;
    return p !== undefined && this.inner.ids.includes(p) ? p : this.inner.ids[0]!;
  }

  seal(plain: Uint8Array, context?: string): Uint8Array {
    this.touch();
    return this.inner.sealWith(this.sealingId, plain, context);
  }

  open(stored: Uint8Array, context?: string): Uint8Array {
    this.touch();
    return this.inner.open(stored, context);
  }

  /** Register as a reader (or say it is still alive) and read the promoted key, in one statement. */
  async refresh(): Promise<void> {
    const s = this.schema;
    const { rows } = await this.db.query<{ key_id: string }>(
      `WITH me AS (
         INSERT INTO ${s}.sealing_readers (instance, key_ids, seen_at) VALUES ($1, $2, now())
         ON CONFLICT (instance) DO UPDATE SET key_ids = EXCLUDED.key_ids, seen_at = now()
       ), first AS (
         INSERT INTO ${s}.sealing_key (key_id) VALUES ($3) ON CONFLICT DO NOTHING RETURNING key_id
       )
       SELECT key_id FROM first UNION ALL SELECT key_id FROM ${s}.sealing_key`,
      [this.instance, this.inner.ids, this.inner.ids[0]],
    );
    this.promoted = rows[0]?.key_id;
    this.checkedAt = Date.now();
  }

  /** Stop counting as a reader (at shutdown): a promotion then no longer waits for this instance. */
  async retire(): Promise<void> {
    await this.db.query(`DELETE FROM ${this.schema}.sealing_readers WHERE instance = $1`, [this.instance]);
  }

  /** Refresh in the background when due; the value at hand is used meanwhile (never a wait on a seal). */
  private touch(): void {
    if (this.refreshing || Date.now() - this.checkedAt < SEALING_REFRESH_MS) return;
    this.refreshing = this.refresh()
      .catch(() => {}) // the database is away: keep the last answer, try again at the next seal
      .finally(() => {
        this.refreshing = undefined;
        this.checkedAt = Date.now();
      });
  }
}

/**
 * Record `keyId` as the key every instance seals with, if every live reader opens it; else a
 * `SealingKeyPromotionError` naming those that do not. One statement: a reader is live when seen in the
 * last `SEALING_READER_LIVE_MS` by the database's clock.
 */
export async function promoteSealingKey(
  db: Db,
  schema: string,
  keyId: string,
): Promise<{ previous: string | undefined }> {
  const { rows } = await db.query<{
    previous: string | null;
    promoted: string | null;
    lacking: Array<{ instance: string; key_ids: string[]; seen_s: number }> | null;
  }>(
    `WITH lacking AS (
       SELECT instance::text, key_ids, round(extract(epoch FROM now() - seen_at))::int AS seen_s
       FROM ${schema}.sealing_readers
       WHERE seen_at > now() - interval '${SEALING_READER_LIVE_MS} milliseconds' AND NOT ($1 = ANY (key_ids))
     ), previous AS (SELECT key_id FROM ${schema}.sealing_key),
     up AS (
       INSERT INTO ${schema}.sealing_key (key_id, promoted_at) SELECT $1, now()
       WHERE NOT EXISTS (SELECT 1 FROM lacking)
       ON CONFLICT (only_row) DO UPDATE SET key_id = EXCLUDED.key_id, promoted_at = EXCLUDED.promoted_at
       RETURNING key_id
     )
     SELECT (SELECT key_id FROM previous) AS previous, (SELECT key_id FROM up) AS promoted,
            (SELECT json_agg(lacking) FROM lacking) AS lacking`,
    [keyId],
  );
  const row = rows[0]!;
  if (row.promoted === null) {
    const who = (row.lacking ?? [])
      .map((r) => `${r.instance} (opens ${r.key_ids.join(", ")}; seen ${r.seen_s} s ago)`)
      .join("; ");
    throw new SealingKeyPromotionError(
      `cannot promote sealing key "${keyId}": ${row.lacking?.length ?? 0} running instance(s) cannot open it: ${who}. ` +
        `Add "${keyId}" to IDEM_ENCRYPTION_KEYS on every instance first (or wait ${SEALING_READER_LIVE_MS / 1000} s if they are gone)`,
    );
  }
  return { previous: row.previous ?? undefined };
}
