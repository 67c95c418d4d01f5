/**
 * The one clause that says which row of a key is live: the key's, not a boundary marker, in the
 * partitions a live row may be in, created within retention by the database's clock (db-time.ts).
 * Every statement that looks a key up reads it through this clause: atomic mode's lookup
 * (keys/lookup.ts), single-statement mode's gate (statement/sql.ts), phases mode's claim
 * (phases/sql.ts), inspection, the operation lookup and the operator tools (`liveKeyRow`).
 */
import type { DbTime } from "./db-time.ts";

/**
 * SQL: the row is the live row of (`scope`, `key`) (SQL expressions: parameters, casts), within
 * `buckets` (default: the partitions the database's clock says a live row may be in, `DbTime.window`;
 * or those named from an estimate, `DbTime.named`).
 */
export function liveRow(t: DbTime, scope: string, key: string, buckets: string = t.window): string {
  return `scope = ${scope} AND key = ${key} AND NOT marker AND ${buckets} AND created_at > ${t.oldest}`;
}
