/**
 * The operation reference: an opaque string that names one claim of a key, handed to clients on every
 * keyed answer (`Idempotency-Operation-Ref`) and in problem responses (`operation_ref`), so that the
 * client can ask what became of it (`GET /v1/operations/{ref}`, src/http/operations.ts) and a person can
 * look it up (`idem keys inspect --ref`). Clients must treat it as opaque; only idem decodes it. It
 * carries nothing the caller does not already know (their own scope and key, and the claim's random id),
 * so it is safe to show to them; it grants nothing: the lookup takes the scope from authentication.
 *
 * It names the claim (`keys.claim_id`, claim-id.ts), not only the key: a key claimed again after it
 * expired is a new operation, and the old reference no longer finds it. A reference made before claim
 * ids existed, or where the claim is not known (an answer given before any row was read), has none and
 * names whatever live claim the key has.
 */
const PREFIX = "op_";
/** A claim id is a UUID (`keys.claim_id`). */
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** The operation reference of one claim of the key `key` in `scope` (`op_` and an opaque encoding). */
export function encodeOperationRef(scope: string, key: string, claimId?: string | null): string {
  const parts = claimId ? [scope, key, claimId] : [scope, key];
  return PREFIX + Buffer.from(JSON.stringify(parts), "utf8").toString("base64url");
}

/** What an operation reference names. `claimId` is absent for a reference that names no claim. */
export interface DecodedOperationRef {
  /** The scope (account) the key belongs to. */
  scope: string;
  /** The idempotency key, as the client sent it. */
  key: string;
  /** Which claim of the key (`keys.claim_id`); absent when the reference names none. */
  claimId?: string;
}

/** The scope, key and claim an operation reference names, or undefined when it is not one of ours. */
export function decodeOperationRef(ref: string): DecodedOperationRef | undefined {
  if (!ref.startsWith(PREFIX)) return undefined;
  try {
    const v: unknown = JSON.parse(Buffer.from(ref.slice(PREFIX.length), "base64url").toString("utf8"));
    if (Array.isArray(v) && (v.length === 2 || v.length === 3) && v.every((p) => typeof p === "string")) {
      const [scope, key, claimId] = v as string[];
      if (claimId === undefined) return { scope: scope!, key: key! };
      if (UUID.test(claimId)) return { scope: scope!, key: key!, claimId };
    }
  } catch {
    // not ours
  }
  return undefined;
}

/** The response header that carries a keyed answer's operation reference. */
export const OPERATION_REF_HEADER = "idempotency-operation-ref";

/** The header every keyed answer carries: its operation (the claim, when known), for the lookup. */
export function operationRefHeader(
  claim: { scope: string; key: string },
  claimId?: string | null,
): [string, string] {
  return [OPERATION_REF_HEADER, encodeOperationRef(claim.scope, claim.key, claimId)];
}
