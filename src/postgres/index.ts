export type { Db, Queryable, QueryResult, Tx } from "./db.ts";
export { fromPg, type PgPoolLike } from "./drivers/pg.ts";
export { fromPglite, type PgliteLike } from "./drivers/pglite.ts";
export { fromPostgresJs, type PostgresJsLike } from "./drivers/postgres-js.ts";
export { type MigrateOptions, type MigrateResult, migrate, pendingMigrations } from "./migrate.ts";
export { Partitions } from "./partitions.ts";
export { type KeyRow, PostgresStore, type PostgresStoreOptions } from "./store.ts";
