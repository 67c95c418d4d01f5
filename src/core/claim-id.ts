/**
 * A claim's identity: which claim of a key a key row is. A key (scope, key) is claimed, kept for the
 * retention window, forgotten, and may then be claimed again: each claim is a new row identity
 * (`keys.claim_id`, a UUID given by the store: time-ordered in phases mode, whose history is indexed
 * by it), kept by every retry, takeover and completer run of that claim. Anything that must name "this
 * operation" outside idem names the claim, never `scope:key`, which outlives our retention and would
 * make a reused key meet an old claim's effect.
 */

/**
 * The key a phases runner hands downstream (a provider's `Idempotency-Key`, or the reference a
 * provider without idempotency keys is searched by): `<scope>:<claim id>`. The scope prefix keeps one
 * account's downstream keys apart from another's (and searchable by account); the claim id makes a
 * key reused after its expiry a new downstream operation. A row claimed before claim ids existed
 * (sql/0008) keeps the key it was started with, `<scope>:<key>`, so that its retries still meet it.
 */
export function downstreamKey(scope: string, key: string, claimId: string | null | undefined): string {
  return `${scope}:${claimId ?? key}`;
}
