/**
 * The provider simulator's refunds and its charges report (provider.ts routes both here). Refunds are
 * shaped like Stripe's:
 *
 *   POST /v1/refunds   {"charge": "ch_...", "amount": 500}  (JSON, or form-encoded as Stripe takes it)
 *       with `Idempotency-Key`: a repeat of the key returns the same refund (`Idempotent-Replayed: true`)
 *       and refunds nothing more; the same key with other parameters is 422.
 *       200 the refund; 404 no such charge; 400 a charge that was declined, or more than what is left
 *       to refund (`amount_too_large`). Without `amount`: whatever is left.
 *   GET  /v1/refunds   every refund made, in order
 *
 * What a charge has had refunded shows in the charges report (`amount_refunded`, provider-report.ts):
 *
 *   GET  /v1/reports/charges?from=&to=&format=csv|json
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Rng } from "./prng.ts";
import { type ChargeLike, handleReport } from "./provider-report.ts";

/** A refund as the simulator stores and returns it. */
export interface Refund {
  /** The refund's id, e.g. `re_...`. */
  id: string;
  /** The charge refunded. */
  charge: string;
  /** The amount refunded, in minor units. */
  amount: number;
  /** The charge's currency. */
  currency: string;
  /** Always `succeeded` (the simulator refunds at once). */
  status: "succeeded";
  /** The `Idempotency-Key` it was made with, or null. */
  idempotency_key: string | null;
  /** Why, as the caller said (`reason`), or null. */
  reason: string | null;
  /** When it was made (ISO 8601). */
  created: string;
}

interface SavedRefund {
  params: string;
  status: number;
  body: string;
}

/** What the refunds need of the simulator around them. */
export interface RefundContext {
  rng: Rng;
  clock: () => number;
  /** The live charges (within retention). */
  charges: () => readonly ChargeLike[];
  readBody: (req: IncomingMessage) => Promise<string>;
  send: (res: ServerResponse, status: number, body: unknown, headers?: Record<string, string>) => void;
}

const error = (code: string, message: string) => ({
  error: { type: "invalid_request_error", code, message },
});

/** The simulator's refunds: made through `handle`, read back by `refunds()` and `refundedOf()`. */
export class RefundDesk {
  #refunds: Refund[] = [];
  #byKey = new Map<string, SavedRefund>();
  #refunded = new Map<string, number>();
  readonly #ctx: RefundContext;

  constructor(ctx: RefundContext) {
    this.#ctx = ctx;
  }

  /** Every refund made, in order. */
  refunds(): Refund[] {
    return this.#refunds.map((r) => ({ ...r }));
  }

  /** How much of a charge has been refunded, in minor units. */
  refundedOf(chargeId: string): number {
    return this.#refunded.get(chargeId) ?? 0;
  }

  reset(): void {
    this.#refunds = [];
    this.#byKey = new Map();
    this.#refunded = new Map();
  }

  /** Answer `/v1/refunds` and `/v1/reports/charges` requests; false for any other path. */
  async handle(req: IncomingMessage, res: ServerResponse, url: URL): Promise<boolean> {
    const { send } = this.#ctx;
    const report = { charges: this.#ctx.charges, refundedOf: (id: string) => this.refundedOf(id), send };
    if (handleReport(report, res, req.method ?? "", url)) return true;
    if (url.pathname !== "/v1/refunds") return false;
    if (req.method === "GET") {
      send(res, 200, { data: this.refunds() });
      return true;
    }
    if (req.method !== "POST") return false;
    const text = await this.#ctx.readBody(req);
    const input = parseInput(text, String(req.headers["content-type"] ?? ""));
    if (!input) {
      send(res, 400, error("invalid_request", "The body is neither JSON nor a form."));
      return true;
    }
    const chargeId = typeof input.charge === "string" ? input.charge : "";
    const amount = input.amount === undefined || input.amount === "" ? undefined : Number(input.amount);
    if (amount !== undefined && !(Number.isInteger(amount) && amount > 0)) {
      send(res, 400, error("invalid_amount", "amount: a positive integer, in minor units."));
      return true;
    }
    const reason = typeof input.reason === "string" && input.reason ? input.reason : null;
    const keyHeader = req.headers["idempotency-key"];
    const key = typeof keyHeader === "string" && keyHeader ? keyHeader : null;
    const params = JSON.stringify([chargeId, amount ?? null]);
    const saved = key ? this.#byKey.get(key) : undefined;
    if (saved) {
      if (saved.params !== params) {
        send(res, 422, {
          error: {
            type: "idempotency_error",
            code: "key_reused",
            message: "This key was used with other parameters.",
          },
        });
      } else {
        send(res, saved.status, saved.body, { "idempotent-replayed": "true" });
      }
      return true;
    }
    const answer = this.#refund(chargeId, amount, key, reason);
    const body = JSON.stringify(answer.body);
    // Remembered under the key whatever the answer: a repeat gets the same one.
    if (key) this.#byKey.set(key, { params, status: answer.status, body });
    send(res, answer.status, body);
    return true;
  }

  #refund(
    chargeId: string,
    amount: number | undefined,
    key: string | null,
    reason: string | null,
  ): { status: number; body: unknown } {
    const charge = this.#ctx.charges().find((c) => c.id === chargeId);
    if (!charge) return { status: 404, body: error("resource_missing", `No such charge: ${chargeId}.`) };
    if (charge.status !== "succeeded") {
      return {
        status: 400,
        body: error("charge_not_refundable", "The charge was declined: nothing to refund."),
      };
    }
    const left = charge.amount - this.refundedOf(charge.id);
    const wanted = amount ?? left;
    if (wanted > left || wanted <= 0) {
      return {
        status: 400,
        body: error("amount_too_large", `Only ${left} of the charge is left to refund; asked for ${wanted}.`),
      };
    }
    const refund: Refund = {
      id: `re_${this.#ctx.rng.hex(24)}`,
      charge: charge.id,
      amount: wanted,
      currency: charge.currency,
      status: "succeeded",
      idempotency_key: key,
      reason,
      created: new Date(this.#ctx.clock()).toISOString(),
    };
    this.#refunds.push(refund);
    this.#refunded.set(charge.id, this.refundedOf(charge.id) + wanted);
    return { status: 200, body: refund };
  }
}

function parseInput(text: string, contentType: string): Record<string, unknown> | undefined {
  if (/application\/x-www-form-urlencoded/i.test(contentType)) {
    return Object.fromEntries(new URLSearchParams(text));
  }
  try {
    const parsed = JSON.parse(text || "{}");
    return typeof parsed === "object" && parsed !== null ? parsed : undefined;
  } catch {
    return undefined;
  }
}
