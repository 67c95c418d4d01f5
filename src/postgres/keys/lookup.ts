/**
 * Reading a key's live row without a lock: what every replay of a finished key reads, in every mode
 * (a finished key row never changes until it expires), one read shared by the replays of the key that
 * come while it is in flight (shared-reads.ts).
 *
 * `lookup` ($1 scope, $2 key): the key's live row as one JSON object and its body, or no row.
 * `lookupAround` names the partitions to read as constants, from this process's estimate of the
 * database's time with a margin (`DbTime.rangeAround`), and bounds them by nothing else: PostgreSQL then
 * prunes the others once, when it plans the statement, and works out no bucket number per execution.
 * Which rows are live is still decided by the database's clock (live.ts). It also says whether its
 * partitions cover every one that clock says a live row may be in (`covers`); when they do not, the
 * caller reads the plain form, bounded by that clock alone. Named partitions roughly halve a lookup's
 * cost per execution: docs/decisions/named-partitions.md.
 */
import { type Db, jsonColumn } from "../db.ts";
import { DbTime } from "./db-time.ts";
import { liveRow } from "./live.ts";
import type { KeyRow } from "./row.ts";
import type { SharedReads } from "./shared-reads.ts";

/**
 * A key row as JSON (`KeyRowJson`): bytes as hex, its creation as epoch ms (the driver parses a
 * timestamp with a regular expression per row).
 */
export const KEY_ROW_JSON = `'bucket', bucket, 'fingerprint', encode(fingerprint, 'hex'),
                    'created_ms', (extract(epoch FROM created_at) * 1000)::float8, 'recovery_point', recovery_point,
                    'status', status, 'headers', headers, 'resource_id', resource_id, 'claim_id', claim_id::text`;

export type LookupSql = ReturnType<typeof lookupSql>;

/** The lookups of a keys table in schema `s`, at its time `t`. */
export function lookupSql(s: string, t: DbTime) {
  // The key's live row (`keyRowOf`), or no row: every replay of a finished key reads this. Two
  // columns, not nine: node-postgres describes each column of each result and copies a row object
  // built field by field. The body stays a bytea column: as hex inside the JSON, a large reply costs
  // PostgreSQL several times more (docs/decisions/atomic-lookup-shape.md).
  // `needs_review_ms`: set on a phases-mode key whose outcome waits for a person (`replayOf`).
  const lookup = (buckets: string) => `SELECT json_build_object(${KEY_ROW_JSON},
                      'needs_review_ms', (extract(epoch FROM needs_review_at) * 1000)::float8) AS live, body
               FROM ${s}.keys
              WHERE ${liveRow(t, "$1", "$2", buckets)}
              ORDER BY bucket DESC LIMIT 1`;
  return {
    lookup: lookup(t.window),
    /**
     * `lookup` in the partitions named from this process's estimate of the database's time
     * (`estimatedMs`), and one more row, of nulls, when they miss one the database's clock says a live
     * row may be in: the caller then reads `lookup` (`readLiveRow`).
     */
    lookupAround: t.aroundEstimate(
      (range) => `(${lookup(DbTime.named(range))})
            UNION ALL SELECT NULL, NULL WHERE NOT ${t.covers(range)}`,
    ),
  };
}

/** A key row as the lookups return it, without its body (bytes as hex, the creation as epoch ms). */
export interface KeyRowJson {
  bucket: number;
  fingerprint: string;
  created_ms: number;
  recovery_point: string;
  status: number | null;
  headers: Array<[string, string]> | null;
  resource_id: string | null;
  claim_id: string | null;
}

/** `lookupAround`'s row that says its partitions miss one. */
interface Nulls {
  live: null;
  body: null;
}

/** What `lookup` returns when the key has a live row. */
export interface LookupRow {
  live: (KeyRowJson & { needs_review_ms: number | null }) | string;
  body: Uint8Array | null;
}

/**
 * The key's live row, or undefined: `lookupAround` (`lookup` when its partitions miss one), one read
 * shared with the replays of the key that come while it is in flight (shared-reads.ts), each caller
 * with a row of its own to answer from. `estimatedMs`: this process's estimate of the database's
 * time, which names the partitions read.
 */
export function readLiveRow(
  reads: SharedReads<LookupRow | undefined>,
  db: Db,
  sql: LookupSql,
  estimatedMs: number,
  id: string,
  claim: { scope: string; key: string },
): Promise<KeyRow | undefined> {
  const { result, joined } = reads.read(id, () => {
    const params = [claim.scope, claim.key];
    return db.query<LookupRow | Nulls>(sql.lookupAround(estimatedMs), params).then(({ rows }) => {
      for (const row of rows) if (row.live !== null) return row as LookupRow;
      // No row: the key has none live. Only the row of nulls: the partitions named miss one.
      return rows.length === 0 ? undefined : db.query<LookupRow>(sql.lookup, params).then((r) => r.rows[0]);
    });
  });
  return result.then((found) => found && lookupRowOf(found, joined));
}

/**
 * The key row `lookup` found (its `live` column parsed by the driver or not), with its body. `copy`
 * when `found` is another caller's read (shared-reads.ts): the row then gets a headers list and a
 * body of its own, since the answer built from them is changed (idem appends its headers to it).
 */
export function lookupRowOf(found: LookupRow, copy = false): KeyRow {
  const j = jsonColumn(found.live);
  const row = keyRowOf(j, copy && found.body ? Buffer.from(found.body) : found.body);
  if (copy && Array.isArray(row.headers)) row.headers = row.headers.map(([name, value]) => [name, value]);
  if (j.needs_review_ms !== null) row.needs_review_at = new Date(j.needs_review_ms);
  return row;
}

/** The key row a lookup's JSON (`KEY_ROW_JSON`) and its body make. */
export function keyRowOf(j: KeyRowJson, body: Uint8Array | null): KeyRow {
  return {
    bucket: j.bucket,
    fingerprint: Buffer.from(j.fingerprint, "hex"),
    created_at: new Date(j.created_ms),
    recovery_point: j.recovery_point,
    status: j.status,
    headers: j.headers,
    body,
    resource_id: j.resource_id,
    claim_id: j.claim_id,
  };
}

/** The statement a lookup of (scope, key) runs, with its parameters (for benchmarks, tests and EXPLAIN). */
export function lookupQuery(
  table: { schema: string; dbTime: DbTime },
  scope: string,
  key: string,
): { text: string; params: unknown[] } {
  return { text: lookupSql(table.schema, table.dbTime).lookup, params: [scope, key] };
}
