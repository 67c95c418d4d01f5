/**
 * Phases mode (recovery points): for requests whose work calls other systems, which no ROLLBACK can undo.
 *
 * A request is a small state machine of named phases, e.g. `started -> charged -> done`. Each phase is
 * either ONE local transaction or ONE external call made idempotent by a key derived from ours
 * (`ctx.idempotencyKey`, `<scope>:<claim id>`: this claim of the key). Never two external calls in one phase: a crash between them
 * would leave no way to tell which one happened.
 *
 *   const payments = definePhases<{ amount: number }, { chargeId: string }>({
 *     store, // a PostgresStore or a ShardedStore
 *     name: "payments",
 *     phases: {
 *       started: {
 *         external: async (ctx) => {
 *           const r = await chargeProvider(url, { amount: ctx.input.amount, idempotencyKey: ctx.idempotencyKey });
 *           if (r.kind === "declined") return { response: jsonResponse(402, { error: "card declined" }) };
 *           if (r.kind !== "charged") throw new RetryableError("provider unavailable");
 *           return { data: { chargeId: r.charge.id } };
 *         },
 *         next: "charged",
 *       },
 *       charged: {
 *         local: async (ctx, tx) => {
 *           await tx.query("INSERT INTO payments ...", [ctx.data.chargeId]);
 *           return { response: jsonResponse(201, { charge: ctx.data.chargeId }) };
 *         },
 *       },
 *     },
 *   });
 *   const outcome = await payments.run(claim, { amount: 5000 });
 *
 * How a key moves (timeline of one request and its retry), file by file:
 *   claim.ts   lookup (no lease taken yet): another fingerprint 422; done: replay; in review: 409
 *              operation-uncertain; a live lease: 409 + Retry-After. A new key is claimed with our lease
 *              in one committed statement (sql.ts); an unfinished one is taken over with the input
 *              stored by its first request.
 *   runner.ts  external phase: the call runs with a heartbeat renewing the lease (lease.ts); then ONE
 *              fenced UPDATE records the next point and the phase's data (`... AND lease_token = mine`;
 *              0 rows: LeaseLostError). Local phase: BEGIN; lock the key row WITH the token check (FOR
 *              UPDATE); the phase's own writes; advance (or save the final answer and drop the lease);
 *              COMMIT. A final answer is saved as done and replayed; a transient failure frees the lease
 *              and is rethrown; a crash (faults.ts in tests) leaves the lease to expire.
 *   review.ts  a call to a system without idempotency whose outcome nothing can establish: the key
 *              waits for a person (`idem keys settle`).
 *   ../keys/table.ts  the narrow view of the store all of this uses, per scope (so sharding works).
 */

export {
  type KeyTable,
  type PhaseStore,
  type ShardedKeyTables,
  tableFor,
  tablesOf,
} from "../keys/table.ts";
export { lookupKey } from "./claim.ts";
export {
  type CrashInfo,
  type CrashPointName,
  type PhaseFaults,
  SimulatedCrashError,
} from "./faults.ts";
export { MAX_IN_FLIGHT_RETRY_AFTER_S } from "./lease.ts";
export {
  NoOpenReviewError,
  openReviews,
  type Review,
  reviewGauge,
  reviewsOf,
  type Settlement,
  SettlementRefusedError,
  settleKey,
  settleReview,
} from "./review.ts";
export { definePhases, PhasesRunner, type RunOptions } from "./runner.ts";
export {
  type ExternalPhase,
  jsonResponse,
  type LocalPhase,
  type Phase,
  type PhaseContext,
  type PhaseStep,
  type PhasesOptions,
} from "./types.ts";
