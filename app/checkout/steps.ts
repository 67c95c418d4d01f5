/**
 * The checkout saga's steps: an order that reserves stock, charges the card and ships, built out of
 * outbox in, inbox out. Each step is one inbox transaction: the message's id is recorded with the step's
 * effect, the checkout's new state, the step's row (at most one per step: `checkout_steps`' primary key)
 * and the next event, all committed together; the acknowledgement follows the commit. A redelivered
 * event finds its id in the inbox and changes nothing.
 *
 *   checkout.placed   -> reserve stock      -> stock.reserved   (or: rejected, no stock; nothing to undo)
 *   stock.reserved    -> charge the card    -> payment.charged  (or payment.declined)
 *   payment.charged   -> ship               -> shipped, done    (or shipment.failed: fails for good)
 *   shipment.failed   -> refund the charge  -> payment.refunded           } compensation, in the
 *   payment.refunded | payment.declined -> release the stock -> cancelled } reverse order
 *
 * The two steps that call the provider (charge, refund) send a key derived from the checkout
 * (`<account>:checkout:<id>:charge|refund`): a redelivery after a crash between the call and the commit
 * repeats the call, which the provider answers with the first result. Every step is also noted on the
 * timeline of the key that placed the checkout (`noteOnKey`), so the console's story of that key shows
 * the flow; and each event carries the trace context of the one that caused it, so the whole saga is
 * one trace.
 */
import { randomBytes } from "node:crypto";
import type { Delivery } from "idem/messaging";
import { noteOnKey, type PostgresStore, type Tx, writeOutbox } from "idem/postgres";
import { httpRefunder } from "idem/reconcile";
import { chargeProvider } from "idem/testing";

export const CHECKOUT_TOPIC = "checkout";

/** Countries the carrier ships to; any other address fails shipping for good. */
export const SHIPS_TO: readonly string[] = ["de", "fr", "nl", "be", "at", "it", "es"];

/** What every saga event carries: which checkout, whose, and the key that placed it. */
export interface CheckoutEvent {
  checkout: string;
  account: string;
  key: string;
}

interface Checkout {
  id: string;
  account_id: string;
  idem_key: string;
  sku: string;
  quantity: number;
  amount_cents: string | number;
  currency: string;
  card: string | null;
  country: string;
  status: string;
  charge_id: string | null;
}

/** What the steps need: the store (for the key's timeline) and the provider. */
export interface StepDeps {
  store: PostgresStore;
  providerUrl: string;
  /** The provider calls' timeout. Default 10,000 ms. */
  providerTimeoutMs?: number;
}

/** Write the saga's next event, carrying the trace context of the message that caused it. */
export async function emit(
  tx: Tx,
  type: string,
  event: CheckoutEvent,
  headers: Record<string, string> = {},
): Promise<void> {
  const trace: Record<string, string> = {};
  for (const h of ["traceparent", "tracestate"]) if (headers[h]) trace[h] = headers[h]!;
  await writeOutbox(tx, {
    topic: CHECKOUT_TOPIC,
    type,
    aggregateType: "checkout",
    aggregateId: event.checkout,
    payload: event,
    headers: trace,
  });
}

/** The saga's inbox handler: one step per event type. */
export function checkoutStep(deps: StepDeps): (tx: Tx, message: Delivery) => Promise<void> {
  const refund = httpRefunder(deps.providerUrl, { timeoutMs: deps.providerTimeoutMs ?? 10_000 });
  return async (tx, message) => {
    const event = JSON.parse(message.body) as CheckoutEvent;
    const { rows } = await tx.query<Checkout>(
      "SELECT * FROM checkouts WHERE id = $1 AND account_id = $2 FOR UPDATE",
      [event.checkout, event.account],
    );
    const c = rows[0];
    if (!c) throw new Error(`checkout ${event.checkout} does not exist`);
    /** Record the step (once: the primary key), the checkout's state, the next event, the key's note. */
    const step = async (
      name: string,
      status: string,
      text: string,
      next?: string,
      set: Record<string, string> = {},
    ) => {
      await tx.query(
        "INSERT INTO checkout_steps (checkout_id, step, message_id, details) VALUES ($1, $2, $3, $4::text::jsonb)",
        [c.id, name, message.id, JSON.stringify(set)],
      );
      const columns = Object.keys(set);
      await tx.query(
        `UPDATE checkouts SET status = $2, updated_at = clock_timestamp()${columns.map((k, i) => `, ${k} = $${i + 3}`).join("")}
          WHERE id = $1 AND account_id = $${columns.length + 3}`,
        [c.id, status, ...columns.map((k) => set[k]), c.account_id],
      );
      if (next) await emit(tx, next, event, message.headers);
      await noteOnKey(
        tx,
        deps.store,
        { scope: c.account_id, key: c.idem_key },
        { step: name, text, details: set },
      );
    };
    const quantity = Number(c.quantity);
    const amount = Number(c.amount_cents);
    switch (message.type) {
      case "checkout.placed": {
        const reserved = await tx.query(
          "UPDATE stock SET available = available - $2 WHERE sku = $1 AND available >= $2",
          [c.sku, quantity],
        );
        if (reserved.rowCount === 1) {
          return step("stock-reserved", "reserved", `reserved ${quantity} x ${c.sku}`, "stock.reserved");
        }
        return step("stock-rejected", "rejected", `not enough ${c.sku} in stock: nothing to undo`);
      }
      case "stock.reserved": {
        const r = await chargeProvider(deps.providerUrl, {
          amount,
          currency: c.currency,
          card: c.card ?? undefined,
          idempotencyKey: `${c.account_id}:checkout:${c.id}:charge`,
          reference: `${c.account_id}:checkout:${c.id}`,
          timeoutMs: deps.providerTimeoutMs ?? 10_000,
        });
        if (r.kind === "charged") {
          return step(
            "charged",
            "charged",
            `charged ${amount} ${c.currency} (${r.charge.id})`,
            "payment.charged",
            {
              charge_id: r.charge.id,
            },
          );
        }
        if (r.kind === "declined") {
          return step(
            "charge-declined",
            "releasing",
            `the card was declined (${r.code})`,
            "payment.declined",
          );
        }
        // Nothing is known yet: the inbox rolls back and the broker redelivers; the same key then meets
        // the first attempt's charge, if there was one.
        throw new Error(`the provider did not charge (${r.kind === "rejected" ? r.message : r.reason})`);
      }
      case "payment.charged": {
        if (SHIPS_TO.includes(c.country)) {
          const shipment = `shp_${randomBytes(8).toString("hex")}`;
          return step("shipped", "shipped", `shipped to ${c.country} (${shipment})`, undefined, {
            shipment_id: shipment,
          });
        }
        return step(
          "ship-failed",
          "refunding",
          `the carrier does not ship to "${c.country}": compensating`,
          "shipment.failed",
        );
      }
      case "shipment.failed": {
        const r = await refund({
          chargeId: c.charge_id!,
          amount,
          currency: c.currency,
          idempotencyKey: `${c.account_id}:checkout:${c.id}:refund`,
          reason: "shipping failed",
          signal: AbortSignal.timeout(deps.providerTimeoutMs ?? 10_000),
        });
        if (r.kind !== "refunded") throw new Error(`the refund did not go through: ${r.message}`);
        return step(
          "refunded",
          "releasing",
          `refunded ${amount} ${c.currency} (${r.id})`,
          "payment.refunded",
          {
            refund_id: r.id,
          },
        );
      }
      case "payment.refunded":
      case "payment.declined": {
        await tx.query("UPDATE stock SET available = available + $2 WHERE sku = $1", [c.sku, quantity]);
        return step(
          "stock-released",
          "cancelled",
          `released ${quantity} x ${c.sku}: the checkout is cancelled`,
        );
      }
      default:
        throw new Error(`the checkout saga has no step for ${message.type}`);
    }
  };
}
