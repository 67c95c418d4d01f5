/**
 * One operation (one claim of a key) as its client may see it: what `GET /v1/operations/{ref}`
 * (src/http/operations.ts) answers from. A store reads it (`operationReader` in idem/postgres); the
 * lookup handler decides who may see it and how it is sent.
 */

import type { OperationRefCodec } from "./operation-ref.ts";
import type { StoredResponse } from "./response.ts";
import type { CompactSaved } from "./store.ts";

/** One operation as the lookup reads it (`OperationReader`). */
export interface OperationRecord {
  /** This claim of the key (`keys.claim_id`); null for a row claimed before claim ids existed. */
  claimId: string | null;
  /** `in_progress` (claimed, not finished), `done`, or `needs_review` (outcome unknown, for a person). */
  state: "in_progress" | "done" | "needs_review";
  /** When the key was claimed (the database's clock). */
  createdAt: Date;
  /** The last step recorded (phases mode), else null. */
  updatedAt: Date | null;
  /** When the key is forgotten (and the reference with it). */
  expiresAt: Date;
  /**
   * The saved answer of a finished operation: the reply, opened exactly as a replay opens it, or a
   * compact key's status and resource id (the route rebuilds its reply). Null while unfinished.
   */
  answer: { kind: "reply"; response: StoredResponse } | { kind: "compact"; saved: CompactSaved } | null;
}

/**
 * Reads the live claim of (scope, key), or undefined when there is none (never claimed, or expired);
 * `refs` opens the references of the store it reads (`operationReader(store)` sets it).
 */
export type OperationReader = ((scope: string, key: string) => Promise<OperationRecord | undefined>) & {
  readonly refs?: OperationRefCodec;
};
