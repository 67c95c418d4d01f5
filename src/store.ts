/**
 * `idem/store`: the types between idem's parts, for code that writes a store, wraps an adapter or
 * passes options along: the store contract (`AtomicStore` and what its calls take and give), the
 * database interface, a route's options (the lifecycle's, and those every adapter takes), what a
 * phases route needs of its runner, and the operation lookup; and the two constants those types name
 * (`Outcome`, `DEFAULT_REPLAYED_HEADERS`). Nothing here runs.
 *
 * A curated list, like every entry point: each type a public signature of idem uses can be imported
 * from some entry point (`npm run api:check` fails otherwise), and those shared by several are here.
 */
export type { FormFields, RequestBody } from "./core/body.ts";
export type { Db, Queryable, QueryResult, Tx } from "./core/db.ts";
export type {
  AdapterOptions,
  AdapterPhasesOptions,
  CompactOptions,
  IdemRequest,
  LifecycleOptions,
  PhasesLifecycleOptions,
  PhasesRunnerLike,
  TraceContextMode,
} from "./core/lifecycle-options.ts";
export type { OperationReader, OperationRecord } from "./core/operation.ts";
export type { RefKey } from "./core/operation-ref.ts";
export { Outcome, type OutcomeEvent } from "./core/outcome.ts";
export { DEFAULT_REPLAYED_HEADERS, type SavePolicy, type StoredResponse } from "./core/response.ts";
export type {
  AtomicOutcome,
  AtomicRunOptions,
  AtomicStore,
  Claim,
  CompactSaved,
  HangUp,
  KeyInspection,
  WorkResult,
} from "./core/store.ts";
