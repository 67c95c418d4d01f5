// The database interface lives in the core (the HTTP adapters and the messaging code need its types
// without depending on the PostgreSQL store); re-exported here for the drivers and for users of
// `idem/postgres`.
export type { Db, Queryable, QueryResult, Tx } from "../core/db.ts";

/**
 * A json column as the driver handed it over: parsed already (node-postgres, PGlite), or as its text
 * (a driver or type setting that leaves JSON unparsed).
 */
export function jsonColumn<T>(value: T | string): T {
  return typeof value === "string" ? (JSON.parse(value) as T) : value;
}
