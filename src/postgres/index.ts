export {
  type CompleteOptions,
  type CompleteReport,
  type CompleteResult,
  complete,
} from "./admin/complete.ts";
export { type KeyNote, noteOnKey } from "./admin/key-notes.ts";
export type { Db, Queryable, QueryResult, Tx } from "./db.ts";
export {
  DatabaseConnectError,
  type DatabaseUrl,
  type OpenDatabaseUrlOptions,
  type OpenedDatabaseUrl,
  openDatabaseUrl,
} from "./drivers/connect.ts";
export {
  type FromPgOptions,
  fromPg,
  type PgClientLike,
  type PgPoolLike,
  type PgQueryable,
} from "./drivers/pg.ts";
export {
  DataDirInUseError,
  fromPglite,
  openPgliteDir,
  type PgliteLike,
  type PgliteQueryable,
} from "./drivers/pglite.ts";
export {
  CommitRolledBackError,
  type FromPostgresJsOptions,
  fromPostgresJs,
  type PostgresJsLike,
  type PostgresJsQueryable,
  type PostgresJsReserved,
} from "./drivers/postgres-js.ts";
export type { TimeShift } from "./keys/db-time.ts";
// Operation lookup (GET /v1/operations/{ref}): the store-side read.
export { operationReader, readOperation } from "./keys/operations.ts";
export { CompactWithoutRebuildError } from "./keys/row.ts";
export type { KeyStore } from "./keys/table.ts";
export { type OutboxEvent, writeOutbox } from "./outbox.ts";
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
export type { PhaseNeeds } from "./phases/needs.ts";
export { isCitus } from "./schema/citus.ts";
export {
  type MigrateOptions,
  type MigrateResult,
  migrate,
  pendingMigrations,
  SchemaBehindError,
} from "./schema/migrate.ts";
export {
  MAX_LIVE_PARTITIONS,
  minPartitionSeconds,
  PartitionMissingError,
  PartitionWidthError,
} from "./schema/partitions.ts";
export { SealingKeyPromotionError } from "./secrets/sealing-keys.ts";
export { hashRoute, ShardedStore, type ShardedStoreOptions, UnknownShardError } from "./sharded.ts";
export {
  SingleStatementStore,
  StatementModeError,
  type StatementReply,
  type StatementSpec,
  statement,
} from "./statement/store.ts";
export { PostgresStore, type PostgresStoreOptions } from "./store.ts";
