export { isCitus } from "./citus.ts";
export { type CompleteOptions, type CompleteReport, type CompleteResult, complete } from "./complete.ts";
export {
  DatabaseConnectError,
  type DatabaseUrl,
  type OpenDatabaseUrlOptions,
  type OpenedDatabaseUrl,
  openDatabaseUrl,
} from "./connect.ts";
export type { Db, Queryable, QueryResult, Tx } from "./db.ts";
export { type FromPgOptions, fromPg, type PgPoolLike } from "./drivers/pg.ts";
export {
  DataDirInUseError,
  fromPglite,
  openPgliteDir,
  type PgliteLike,
} from "./drivers/pglite.ts";
export {
  CommitRolledBackError,
  type FromPostgresJsOptions,
  fromPostgresJs,
  type PostgresJsLike,
  type PostgresJsReserved,
} from "./drivers/postgres-js.ts";
export { type KeyNote, noteOnKey } from "./key-notes.ts";
export { CompactWithoutRebuildError, type KeyRow } from "./keys/row.ts";
export {
  type MigrateOptions,
  type MigrateResult,
  migrate,
  pendingMigrations,
  SchemaBehindError,
} from "./migrate.ts";
// Operation lookup (GET /v1/operations/{ref}): the store-side read.
export { operationReader, readOperation } from "./operations.ts";
export { type OutboxEvent, writeOutbox } from "./outbox.ts";
export {
  MAX_LIVE_PARTITIONS,
  minPartitionSeconds,
  PartitionMissingError,
  Partitions,
  PartitionWidthError,
} from "./partitions.ts";
export {
  type CrashInfo,
  type CrashPointName,
  definePhases,
  type ExternalPhase,
  jsonResponse,
  type KeyTable,
  type LocalPhase,
  MAX_IN_FLIGHT_RETRY_AFTER_S,
  NoOpenReviewError,
  openReviews,
  type Phase,
  type PhaseContext,
  type PhaseFaults,
  type PhaseStep,
  type PhaseStore,
  type PhasesOptions,
  PhasesRunner,
  type Review,
  type RunOptions,
  reviewGauge,
  type Settlement,
  SettlementRefusedError,
  type ShardedKeyTables,
  SimulatedCrashError,
  settleKey,
  settleReview,
} from "./phases/index.ts";
export { SealingKeyPromotionError } from "./sealing-keys.ts";
export { hashRoute, ShardedStore, type ShardedStoreOptions, UnknownShardError } from "./sharded.ts";
export {
  SingleStatementStore,
  StatementModeError,
  type StatementReply,
  type StatementSpec,
  statement,
} from "./statement/store.ts";
export { PostgresStore, type PostgresStoreOptions } from "./store.ts";
