/**
 * The secrets a store seals its operation references with (core/operation-ref.ts): the database's own
 * (`settings.ref_secret`, made by sql/0017 from the server's random source), and, when the store has
 * encryption keys (`IDEM_ENCRYPTION_KEYS`, a keyed sealer), one derived from each of them. New
 * references are sealed with the promoted encryption key's (sealing-keys.ts: a key every running
 * instance opens), else with the database's; every one of them opens the references it sealed. So a
 * rotation of the encryption keys rotates the references' keys with it, with the same rule: keep a key
 * until everything sealed with it has expired (a reference lives as long as its key row).
 */
import { type OperationRefCodec, OperationRefs, type RefKey, type Sealer } from "../../core/index.ts";
import { PromotedSealer } from "./sealing-keys.ts";

/** What `HKDF` is told a derived secret is for. */
const PURPOSE = "operation_ref";

/** The references of one database: `db` is its own secret (settings), `sealer` the store's. */
export function storeRefs(db: RefKey, sealer: Sealer | undefined): OperationRefs {
  const inner = sealer instanceof PromotedSealer ? sealer.inner : undefined;
  if (!inner?.derive) return new OperationRefs([db]);
  const derived = inner.ids.map((id) => ({ id, secret: inner.derive!(id, PURPOSE) }));
  const promoted = sealer as PromotedSealer;
  return new OperationRefs([...derived, db], () => promoted.sealingId);
}

/** The database's own secret from its settings row (undefined before sql/0017). */
export function dbRefKey(settings: { ref_key_id?: unknown; ref_secret?: unknown }): RefKey | undefined {
  const id = settings.ref_key_id;
  const secret = settings.ref_secret;
  if (typeof id !== "string" || !(secret instanceof Uint8Array)) return undefined;
  return { id, secret };
}

/**
 * The references of several databases (a `ShardedStore`): sealed with the scope's shard's secret,
 * opened by whichever shard's secret a reference names.
 */
export function shardedRefs(
  shardOf: (scope: string) => { refs: OperationRefCodec },
  all: () => Array<{ refs: OperationRefCodec }>,
): OperationRefCodec {
  return {
    encode: (scope, key, claimId) => shardOf(scope).refs.encode(scope, key, claimId),
    decode(ref) {
      for (const shard of all()) {
        const found = shard.refs.decode(ref);
        if (found) return found;
      }
      return undefined;
    },
  };
}
