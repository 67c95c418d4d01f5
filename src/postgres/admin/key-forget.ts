/**
 * Forgetting a key before it expires, so that the same key is new again, and the rule for when that is
 * safe. A forgotten key's next request is a NEW claim with a new claim id, hence a new downstream key
 * (claim-id.ts): the provider sees a new operation and charges again. So a key may be forgotten only
 * when its records show that nothing it did can be repeated:
 *
 *   allowed   a saved 4xx (a final answer that applied nothing: docs/contract.md), unless the key was
 *             ever taken over or looked up; a phases claim whose work never started (every lease it
 *             had was freed before any call went out, no recovery point reached)
 *   refused   a saved success (or any other saved answer); a phases key past the start of its call (a
 *             recovery point reached, a call begun or freed after it began, a lease that ran out with
 *             nobody to say what its worker did); a key ever taken over or looked up; a key whose
 *             records cannot tell (claimed before its history was kept)
 *   never     while it waits for a person (settle it) or a worker holds its lease
 *
 * The refusals that say "its effect may have happened" can be overridden by a person who confirms they
 * reversed that effect (refunded the charge): `effectReversed`, recorded as `key.forget.effect-reversed`
 * with the refusal it overrode. The verdict is computed from the rows read in the forgetting
 * transaction (the lease by the database's clock); `keyStory` shows the same verdict to the console.
 * `forgetKey` (key-admin.ts) applies it.
 */
import type { KeyInspection } from "../../core/index.ts";
import type { Db } from "../db.ts";
import type { KeyTable } from "../keys/table.ts";
import { type KeyEvent, keyEvents } from "../phases/history.ts";

/** Thrown by `forgetKey` when forgetting the key could repeat an effect or cut a worker off. */
export class CannotForgetError extends Error {
  /** Always `"CannotForgetError"`: the name logs and stack traces show. */
  override name = "CannotForgetError";
  /** Whether a person who reversed the key's effect may forget it anyway (`effectReversed`). */
  readonly overridable: boolean;
  constructor(message: string, overridable = false) {
    super(message);
    this.overridable = overridable;
  }
}

/** Whether a key may be forgotten now, and why (what the console shows next to the button). */
export interface ForgetVerdict {
  /** True when its records show that forgetting it cannot repeat an effect. */
  allowed: boolean;
  /** Why, in one line for a person. */
  why: string;
  /** When refused: whether a person who reversed the effect may forget it anyway (`effectReversed`). */
  overridable: boolean;
}

/** What the verdict is made from: the key, its history (phases mode), and its row's own records. */
export interface ForgetFacts {
  key: KeyInspection;
  /** The key's recorded history (empty in atomic mode, or for a key claimed before sql/0014). */
  history: KeyEvent[];
  /** Whether a worker holds its lease now, by the database's clock. */
  leaseLive: boolean;
  /** `attempted_at`: a call to a system without idempotency keys may have begun. */
  attempted: boolean;
  /** Provider lookups that could not tell. */
  lookupFailures: number;
}

const refused = (why: string): ForgetVerdict => ({ allowed: false, why, overridable: true });

/** The forget rule (see the top of this file). */
export function forgetVerdict(f: ForgetFacts): ForgetVerdict {
  const k = f.key;
  if (k.state === "needs_review") {
    return {
      allowed: false,
      why: "it waits for a person: settle it (its effect may have happened)",
      overridable: false,
    };
  }
  if (f.leaseLive) {
    return {
      allowed: false,
      why: `a worker holds its lease${k.lease ? ` until ${k.lease.until.toISOString()}` : ""}: wait until it ends`,
      overridable: false,
    };
  }
  const has = (kind: KeyEvent["kind"]) => f.history.some((e) => e.kind === kind);
  if (has("takeover") || has("fencing-refused")) {
    return refused(
      "it was taken over from a worker that stopped mid-phase, whose call may have taken effect",
    );
  }
  if (has("lookup") || f.lookupFailures > 0) {
    return refused("the provider was asked whether its call took effect: one may have");
  }
  if (k.saved) {
    const status = k.saved.status;
    if (status >= 400 && status < 500) {
      return { allowed: true, why: `its saved answer (${status}) applied nothing`, overridable: false };
    }
    return refused(
      `its saved answer (${status}) says the operation took effect: a retry after forgetting would do it again`,
    );
  }
  if (has("recovery-point")) {
    return refused(`it got past its first phase (now at ${k.recoveryPoint}): what it did so far is kept`);
  }
  if (has("call-begun") || f.attempted) {
    return refused(`an external call of ${k.recoveryPoint} began: its outcome is not recorded`);
  }
  if (f.history.length === 0) {
    return refused("its records do not show whether its work began (no history was kept for it)");
  }
  // Every lease it had must have been freed by its worker, before any call went out.
  let open = false;
  for (const e of f.history) {
    if (e.kind === "claimed" || e.kind === "lease-taken") open = true;
    else if (e.kind === "lease-released") {
      open = false;
      if (e.details?.called === true) {
        return refused(
          `its call of ${k.recoveryPoint} went out and did not answer: it may have taken effect`,
        );
      }
    }
  }
  if (open) {
    return refused("its last worker's lease ran out with no word of what it did: it may have called out");
  }
  return { allowed: true, why: "its claim never started its work", overridable: false };
}

interface ForgetRow {
  lease_live: boolean;
  attempted: boolean;
  lookup_failures: number;
}

/** The row's own facts, read with the database's clock (`lock`: FOR UPDATE, in a transaction). */
export async function forgetFacts(
  db: Pick<Db, "query">,
  table: KeyTable,
  k: KeyInspection,
  lock = false,
): Promise<ForgetFacts | undefined> {
  const { rows } = await db.query<ForgetRow>(
    `SELECT lease_until IS NOT NULL AND lease_until > ${table.dbTime.now} AS lease_live,
            attempted_at IS NOT NULL AS attempted, lookup_failures
       FROM ${table.schema}.keys
      WHERE scope = $1 AND key = $2 AND NOT marker AND claim_id IS NOT DISTINCT FROM $3::uuid
        AND (needs_review_at IS NULL) = $4${lock ? " FOR UPDATE" : ""}`,
    [k.scope, k.key, k.claimId, k.state !== "needs_review"],
  );
  if (rows.length === 0) return undefined;
  const history = k.claimId ? await keyEvents(db, table.schema, { ...k, claimId: k.claimId }) : [];
  return {
    key: k,
    history,
    leaseLive: rows.some((r) => r.lease_live),
    attempted: rows.some((r) => r.attempted),
    lookupFailures: Math.max(0, ...rows.map((r) => Number(r.lookup_failures ?? 0))),
  };
}

/** Who forgets a key, why, and whether they confirm having reversed its effect. */
export interface ForgetBy {
  /** Who (recorded). */
  actor: string;
  /** Why (recorded). Required. */
  reason: string;
  /**
   * The person confirms that they reversed the key's effect (e.g. refunded the charge), so that its
   * next request may do it again: overrides a refusal that says its effect may have happened (never a
   * live lease or an open review). Recorded as `key.forget.effect-reversed`. Default: false.
   */
  effectReversed?: boolean;
}
