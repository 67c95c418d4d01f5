/**
 * The checkout saga's worker: the relay and the consumer of the `checkout` topic (app/worker.ts), whose
 * inbox handler is the saga's steps (steps.ts).
 *
 *   const saga = await startCheckoutSaga(db, { store, providerUrl }, loadConfig(process.env).receipts);
 *   ...
 *   await saga.stop(); // before closing the database
 */
import type { Db } from "idem/postgres";
import { startWorker, type TransportConfig, type Worker, type WorkerSpec } from "../worker.ts";
import { CHECKOUT_TOPIC, checkoutStep, type StepDeps } from "./steps.ts";

/** Start the saga's relay and consumer. `faults`: the messaging fault suite's crash points (tests). */
export function startCheckoutSaga(
  db: Db,
  deps: StepDeps,
  config: TransportConfig = {},
  faults: Pick<WorkerSpec, "relayCrash" | "consumerCrash" | "relayLeaseMs"> = {},
): Promise<Worker> {
  return startWorker(
    db,
    {
      topic: CHECKOUT_TOPIC,
      consumer: "checkout-saga",
      stream: "IDEM_CHECKOUT",
      handler: checkoutStep(deps),
      maxAttempts: 10,
      ...faults,
    },
    config,
  );
}
