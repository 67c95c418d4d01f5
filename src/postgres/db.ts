// The database interface lives in the core (the HTTP adapters and the messaging code need its types
// without depending on the PostgreSQL store); re-exported here for the drivers and for users of
// `idem/postgres`.
export type { Db, Queryable, QueryResult, Tx } from "../core/db.ts";
