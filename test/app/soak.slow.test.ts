/**
 * Issue 33, the short version of the service part of `npm run bench -- soak`: 6,000 keyed payments
 * against the reference service in a process of its own (phases mode, the provider simulator keeping
 * keys and charges for one second, so it expires thousands of them during the run), its heap measured
 * after forced collections along the way. Fails when a payment is not charged exactly once (the 201s,
 * the provider's charges, the payment rows and the receipt emails must agree) or when the heap grows
 * more than 400 bytes per payment (the simulator that never forgot a charge grew about 600; the
 * lowest heap after GC still moves by about half a megabyte between samples of a run this short). No timing
 * is asserted; the heap is compared at its lowest in two windows (requests in flight come and go).
 */
import { describe, expect, it } from "vitest";
import { growthPerItem, soakService } from "../../bench/soak.ts";
import { serverBackends } from "../helpers/db.ts";

const backend = serverBackends.find((b) => b.name === "pg");
const PAYMENTS = 6_000;

describe.skipIf(!backend)("the reference service over many payments: bounded memory", () => {
  it("6,000 keyed payments each charged once, the heap growing under 400 B per payment", async () => {
    const r = await soakService({
      payments: PAYMENTS,
      sampleEvery: 300,
      concurrency: 16,
      providerRetentionMs: 1_000,
    });
    const perPayment = growthPerItem(r);
    console.log(
      `service: ${PAYMENTS} payments in ${r.seconds.toFixed(1)} s, heap ${r.samples[0]!.heapMB.toFixed(1)} -> ${r.samples.at(-1)!.heapMB.toFixed(1)} MB, ${perPayment.toFixed(0)} B per payment`,
    );
    expect(r.payments).toMatchObject({
      answered: PAYMENTS,
      created: PAYMENTS,
      charges: PAYMENTS,
      rows: PAYMENTS,
      distinct: PAYMENTS,
      receipts: PAYMENTS,
    });
    expect(perPayment).toBeLessThan(400);
  }, 300_000);
});
