/**
 * The PostgreSQL error codes (SQLSTATE) idem reacts to, named once, and the one test of "the database
 * is unavailable" that every adapter uses to answer 503 + Retry-After instead of 500.
 * https://www.postgresql.org/docs/current/errcodes-appendix.html
 */
export const SqlState = {
  UniqueViolation: "23505",
  SerializationFailure: "40001",
  DeadlockDetected: "40P01",
  UndefinedTable: "42P01",
  DuplicateSchema: "42P06",
  WrongObjectType: "42809",
  CheckViolation: "23514",
  DuplicateObject: "42710",
  DuplicateTable: "42P07",
  ObjectInUse: "55006",
  LockNotAvailable: "55P03",
  QueryCanceled: "57014",
  AdminShutdown: "57P01",
  CrashShutdown: "57P02",
  CannotConnectNow: "57P03",
  TooManyConnections: "53300",
  ReadOnlySqlTransaction: "25006",
  InsufficientPrivilege: "42501",
  UndefinedColumn: "42703",
  ProtocolViolation: "08P01",
  DuplicatePreparedStatement: "42P05",
  InvalidSqlStatementName: "26000",
} as const;
/** One of the values of {@link SqlState}. */
export type SqlState = (typeof SqlState)[keyof typeof SqlState];

/** Class 08: connection exception (08000, 08003, 08006, 08001, 08004, ...). */
const CONNECTION_EXCEPTION_CLASS = "08";

/**
 * "Try again, on the new primary": after a failover a connection may still reach the old primary, now
 * read-only (25006), or a server shutting down or starting (57P01-57P03), or too busy (53300).
 */
const UNAVAILABLE_SQLSTATES = new Set<string>([
  SqlState.ReadOnlySqlTransaction,
  SqlState.AdminShutdown,
  SqlState.CrashShutdown,
  SqlState.CannotConnectNow,
  SqlState.TooManyConnections,
]);

/** Socket errors of Node and the connection-state codes of postgres.js. */
const UNAVAILABLE_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ECONNABORTED",
  "ETIMEDOUT",
  "EPIPE",
  "ENOTFOUND",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EAI_AGAIN",
  "CONNECTION_CLOSED",
  "CONNECTION_ENDED",
  "CONNECTION_DESTROYED",
  "CONNECT_TIMEOUT",
]);

/** What drivers say without a code: pg and pg-pool (connection lost, pool timeout), PGlite closed. */
const UNAVAILABLE_MESSAGES =
  /^(Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error|Client was closed and is not queryable|PGlite is closed)/;

/** The SQLSTATE of a driver error, when it carries one (`pg`, postgres.js and PGlite all use `code`). */
export function sqlStateOf(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
}

/**
 * True when `err` (or an error in its `cause` chain) says the database cannot be reached or is
 * shutting down or starting: a connection error, a pool that gave up waiting for a connection, or one
 * of 57P01/57P02/57P03/53300/08xxx, or 25006 (a write reached a read-only server: the old primary after
 * a failover, or a replica). The transaction did not commit, so the request may be retried: adapters
 * answer it 503 problem+json with Retry-After.
 */
export function isDatabaseUnavailable(err: unknown): boolean {
  for (let e = err, depth = 0; e && typeof e === "object" && depth < 5; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") {
      if (UNAVAILABLE_SQLSTATES.has(code) || UNAVAILABLE_CODES.has(code)) return true;
      if (code.length === 5 && code.startsWith(CONNECTION_EXCEPTION_CLASS)) return true;
    }
    const message = (e as { message?: unknown }).message;
    if (typeof message === "string" && UNAVAILABLE_MESSAGES.test(message)) return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/** Failures to obtain a connection at all: no statement of this request reached the database. */
const CONNECT_CODES = new Set([
  SqlState.CannotConnectNow,
  SqlState.TooManyConnections,
  "ECONNREFUSED",
  "ENOTFOUND",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EAI_AGAIN",
  "CONNECT_TIMEOUT",
]);
// A closed PGlite refuses before anything runs, as a server that cannot be reached does.
const CONNECT_MESSAGES = /^(timeout exceeded when trying to connect|PGlite is closed)/;

/**
 * True when `err` says no connection could be had, so nothing this request sent can have committed. A
 * connection lost later (even during COMMIT) leaves the outcome unknown: callers must then not promise
 * that nothing happened.
 */
export function isConnectFailure(err: unknown): boolean {
  for (let e = err, depth = 0; e && typeof e === "object" && depth < 5; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && CONNECT_CODES.has(code)) return true;
    const message = (e as { message?: unknown }).message;
    if (typeof message === "string" && CONNECT_MESSAGES.test(message)) return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/**
 * What PgBouncer says in its own name (protocol violation 08P01 with texts of its own: a login timeout
 * while the server is down, a full pool, a startup parameter it does not pass on, ...).
 */
const POOLER_MESSAGES =
  /pgbouncer|pooler|client_login_timeout|query_wait_timeout|client_idle_timeout|idle transaction timeout|max_client_conn|server_login_retry|unsupported startup parameter|no such (user|database)|"trust" authentication failed|server conn crashed|bouncer config error|database removed/i;

/**
 * Whether `err` came from a connection pooler between here and PostgreSQL rather than from the server:
 * `"pooler"` for PgBouncer's own errors, `"prepared-statement"` for a named prepared statement that a
 * transaction pooler lost or found on another client's session (42P05, 26000). Undefined otherwise.
 */
export function poolerError(err: unknown): "pooler" | "prepared-statement" | undefined {
  const code = sqlStateOf(err);
  const message = String((err as { message?: unknown } | null)?.message ?? "");
  if (code === SqlState.ProtocolViolation && POOLER_MESSAGES.test(message)) return "pooler";
  if (
    (code === SqlState.DuplicatePreparedStatement || code === SqlState.InvalidSqlStatementName) &&
    /prepared statement/.test(message)
  ) {
    return "prepared-statement";
  }
  return undefined;
}

/**
 * An insert found no partition for its bucket (PostgreSQL answers a check violation, 23514, "no
 * partition of relation ... found for row"): the caller creates the partition and tries again.
 */
export function isMissingPartition(err: unknown): boolean {
  return sqlStateOf(err) === SqlState.CheckViolation && /no partition/.test(String((err as Error)?.message));
}
