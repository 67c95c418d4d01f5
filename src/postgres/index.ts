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
  type FromPostgresJsOptions,
  fromPostgresJs,
  type PostgresJsLike,
} from "./drivers/postgres-js.ts";
export {
  type MigrateOptions,
  type MigrateResult,
  migrate,
  pendingMigrations,
  SchemaBehindError,
} from "./migrate.ts";
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
  type ShardedKeyTables,
  SimulatedCrashError,
  settleKey,
} from "./phases/index.ts";
export { SealingKeyPromotionError } from "./sealing-keys.ts";
export { hashRoute, ShardedStore, type ShardedStoreOptions, UnknownShardError } from "./sharded.ts";
export {
  CompactWithoutRebuildError,
  type KeyRow,
  PostgresStore,
  type PostgresStoreOptions,
} from "./store.ts";
