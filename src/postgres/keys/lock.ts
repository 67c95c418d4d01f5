/**
 * The per-key lock: what serialises every request for one (scope, key), whatever the partition its
 * row is in. Atomic mode takes it with BEGIN and waits for it briefly in the server; single-statement
 * mode tries it inside its statement (`pg_try_advisory_xact_lock`); both use the same lock id, so the
 * two modes exclude each other on one key.
 */
import { sha256 } from "../../core/sha256.ts";
import { shardLockSql } from "../schema/citus.ts";

/** How long the server waits for a key's lock before the duplicate lets its connection go and sleeps. */
export const LOCK_WAIT_MS = 10;

/** What the lock needs of its store. */
export interface LockPlace {
  readonly schema: string;
  readonly lockTimeoutMs: number;
  /** The keys table is distributed with Citus: the lock is taken on the key's shard. */
  readonly distributed: boolean;
  /** The driver takes one parameterised statement with BEGIN. */
  readonly supportsBeginParams?: boolean | undefined;
}

/**
 * What serialises every request for one (scope, key), sent with BEGIN so that it costs no round trip
 * of its own: a transaction-scoped advisory lock, waited for in the server at most `LOCK_WAIT_MS`
 * (then 55P03, and the caller sleeps without a connection and tries again); the lock timeout is put
 * back right after the lock, so it does not bound the work.
 *
 * One parameterised statement (prepared on a direct connection) when the driver takes one with
 * BEGIN: `set_config(..., true)` is transaction-local, so nothing outlives the transaction (safe
 * through PgBouncer's transaction mode); evaluated in order, the inner row saves the timeout, sets
 * the wait and takes the lock (OFFSET 0 keeps that subquery whole), the outer puts the timeout back
 * in its filter and selects no column (the driver describes and copies every column it is sent).
 * Otherwise, and on Citus (`shardLockSql`), the same as SQL text with the lock id as a literal.
 * That text with BEGIN would be one statement fewer on the wire, but PostgreSQL parses and plans it
 * every time, which costs it more than the round trip saves (docs/decisions/atomic-lock-and-claim.md).
 */
export function lockSql(
  place: LockPlace,
  scope: string,
  key: string,
): string | { sql: string; params: readonly unknown[] } {
  const wait = Math.max(1, Math.min(LOCK_WAIT_MS, Math.floor(place.lockTimeoutMs)));
  if (place.distributed) return shardLockSql(place.schema, scope, keyLockId(scope, key), wait);
  if (place.supportsBeginParams) return { sql: lockStatement(wait), params: [keyLockId(scope, key)] };
  return (
    `SET LOCAL lock_timeout = '${wait}ms'; ` +
    `SELECT pg_advisory_xact_lock(${keyLockId(scope, key)}); SET LOCAL lock_timeout TO DEFAULT`
  );
}

/**
 * The per-key lock as one statement ($1: the lock id), waiting at most `waitMs` (see `lockSql`). Built
 * once per wait: the driver names prepared statements by their text, and a fresh string would be hashed
 * again on every request.
 */
function lockStatement(waitMs: number): string {
  let text = lockStatements.get(waitMs);
  if (text === undefined) {
    text =
      "SELECT FROM (" +
      `SELECT current_setting('lock_timeout') AS prev, set_config('lock_timeout', '${waitMs}ms', true) AS wait, ` +
      "pg_advisory_xact_lock($1::bigint) AS locked OFFSET 0) w WHERE set_config('lock_timeout', w.prev, true) IS NOT NULL";
    lockStatements.set(waitMs, text);
  }
  return text;
}
/** The lock statements built, by wait in ms (at most LOCK_WAIT_MS of them). */
const lockStatements = new Map<number, string>();

/** A signed 64-bit lock id for (scope, key): the first 8 bytes of SHA-256, as a decimal literal. */
export function keyLockId(scope: string, key: string): string {
  // The same bytes as ever (UTF-8 of the three): old and new instances take the same lock.
  return sha256(`${scope}\0${key}`).readBigInt64BE(0).toString();
}
