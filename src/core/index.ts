/**
 * The core's internal barrel: adapters, the store, the client and the tests import from here by
 * relative path. It is not an entry point: the package root `idem` is src/index.ts, a curated list.
 */
export * from "./body.ts";
export * from "./claim-id.ts";
export * from "./db.ts";
export * from "./errors.ts";
export * from "./fingerprint.ts";
export * from "./guarded-tx.ts";
export * from "./key.ts";
export * from "./lifecycle.ts";
export * from "./lifecycle-options.ts";
export * from "./operation.ts";
export * from "./operation-ref.ts";
export * from "./options.ts";
export * from "./outcome.ts";
export * from "./problem.ts";
export * from "./redact.ts";
export * from "./response.ts";
export * from "./sealing.ts";
export * from "./sqlstate.ts";
export * from "./store.ts";
export * from "./stored-errors.ts";
