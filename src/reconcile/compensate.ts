/**
 * What is done about a finding runs as a key of the `reconcile` phases runner, like any other effect:
 * claimed under the finding's account (or `reconcile`) with the key `reconcile:<finding id>`, so that
 * it happens once however often the job runs, crashes half-way or is started twice at once.
 *
 *   decide   (external, no call)  a refund within the operator's limit goes on to `refund`; anything else
 *                                 waits for a person: a review in the console's queue (409 until settled)
 *   refund   (external)           the refund at the provider, with the key's own downstream reference as
 *                                 its idempotency key: a repeat after a crash refunds nothing more. A
 *                                 refusal (already refunded by hand, say) goes to review.
 *   record   (local)              the finding becomes `refunded`, with the refund's id, in the same
 *                                 transaction as the key's saved answer (and `afterRefund`'s writes)
 *
 * A person settles a review in the console (or `idem keys settle`): resume at `refund` to refund, or
 * close it with an answer. The next run (or `idem complete` with this runner) carries on from there.
 */
import { RetryableError } from "../core/index.ts";
import type { Tx } from "../postgres/db.ts";
import { definePhases, jsonResponse, type PhasesRunner } from "../postgres/phases/index.ts";
import type { PostgresStore } from "../postgres/store.ts";
import type { FindingKind } from "./compare.ts";
import { setFindingState } from "./findings.ts";

/** The runner's name, stored with each of its keys (the completer finds it by it). */
export const RECONCILE_RUNNER = "reconcile";

/** One refund to make. */
export interface RefundRequest {
  /** The provider's charge. */
  chargeId: string;
  /** In minor units. */
  amount: number;
  currency: string;
  /** Send it as the provider's `Idempotency-Key`: the same on every retry of this refund. */
  idempotencyKey: string;
  /** Why (the finding's line), for the provider's records. */
  reason: string;
  /** Aborted when this worker lost its lease: pass it to the call. */
  signal: AbortSignal;
}

/** How a refund call ended. */
export type RefundResult =
  | { kind: "refunded"; id: string }
  /** The provider refused it for good (nothing left to refund, no such charge): a person looks. */
  | { kind: "rejected"; message: string }
  /** Nothing is known (a timeout, a 5xx): the same key is sent again later. */
  | { kind: "transient"; message: string };

/** Makes a refund at the provider (see `httpRefunder` for Stripe-shaped APIs). */
export type Refunder = (request: RefundRequest) => Promise<RefundResult>;

/** What the runner stores with each key: the finding, and what was decided for it. */
export interface ActionInput {
  finding: {
    id: string;
    kind: FindingKind;
    chargeId: string | null;
    amount: number;
    currency: string;
    detail: string;
  };
  action: "refund" | "review";
  /** Why a person is asked (review), or why it is refunded. */
  reason: string;
}

/** What the runner records between its phases: the refund made. */
export type ActionData = { refundId: string };

/** Options of {@link reconcileRunner}. */
export interface ReconcileRunnerOptions {
  /** The store the findings and the actions' keys live in. Required. */
  store: PostgresStore;
  /** Makes refunds. Without one, every action waits for a person. */
  refund?: Refunder;
  /**
   * Also done in the transaction that records a refund (e.g. mark the service's payment refunded).
   * Default: nothing.
   */
  afterRefund?: (tx: Tx, finding: ActionInput["finding"], refundId: string) => Promise<void>;
  /** The lease. Default: the runner's (10 s). */
  leaseMs?: number;
}

/** The `reconcile` phases runner (see the module's notes). */
export function reconcileRunner(o: ReconcileRunnerOptions): PhasesRunner<ActionInput, ActionData> {
  const schema = o.store.schema;
  return definePhases<ActionInput, ActionData>({
    store: o.store,
    name: RECONCILE_RUNNER,
    leaseMs: o.leaseMs,
    phases: {
      decide: {
        external: async (ctx) =>
          ctx.input.action === "refund" && o.refund ? undefined : { review: ctx.input.reason },
        next: "refund",
      },
      refund: {
        external: async (ctx) => {
          const f = ctx.input.finding;
          if (!o.refund) throw new RetryableError("no refunder is configured: cannot refund yet");
          if (!f.chargeId || !(f.amount > 0)) {
            return { review: `${f.detail}: there is no charge amount to refund` };
          }
          const r = await o.refund({
            chargeId: f.chargeId,
            amount: f.amount,
            currency: f.currency,
            idempotencyKey: ctx.idempotencyKey,
            reason: f.detail,
            signal: ctx.signal,
          });
          if (r.kind === "refunded") return { data: { refundId: r.id } };
          if (r.kind === "rejected") return { review: `the provider refused the refund: ${r.message}` };
          throw new RetryableError(`the refund did not go through (${r.message}); it is tried again`);
        },
        next: "record",
      },
      record: {
        local: async (ctx, tx) => {
          const refundId = ctx.data.refundId!;
          await setFindingState(tx, schema, ctx.input.finding.id, "refunded", refundId);
          await o.afterRefund?.(tx, ctx.input.finding, refundId);
          return { response: jsonResponse(200, { finding: ctx.input.finding.id, refund: refundId }) };
        },
      },
    },
  });
}
