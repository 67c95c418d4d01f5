/**
 * Open a PostgreSQL server from a URL, as idem's command line and the reference service do: the driver
 * chosen by the URL's form, a pooler in between recognised, and a failure to start told as what it is.
 *
 *   postgres://app@db:5432/app                        node-postgres, pipelined
 *   postgres://app@db1:5432,db2:5432/app?target_session_attrs=read-write
 *                                                     postgres.js: it tries each host and keeps the one
 *                                                     that takes writes (node-postgres takes one host)
 *   postgres://app@pgbouncer:6432/app?pgbouncer=true  no named prepared statements (Prisma's convention;
 *                                                     without it a pooler is detected on the first
 *                                                     connection anyway, see `FromPgOptions.prepare`)
 */
import { poolerError, sqlStateOf } from "../../core/sqlstate.ts";
import type { Db } from "../db.ts";
import { type Listen, listenWithPg, listenWithPostgresJs } from "./listen.ts";
import type { PostgresJsLike } from "./postgres-js.ts";

/** A PostgreSQL URL taken apart (see {@link parseDatabaseUrl}). */
export interface DatabaseUrl {
  /** The URL for the driver: idem's own parameter (`pgbouncer`) removed. */
  url: string;
  /** Host(s) and database, without user or password, for messages. */
  where: string;
  /** The URL's hosts (`host:port`, as written), in order; several for failover. */
  hosts: string[];
  /** `false` with `?pgbouncer=true` (a transaction pooler: no named statements), `"auto"` otherwise. */
  prepare: false | "auto";
  /** Several hosts, or `target_session_attrs`: only postgres.js follows them. */
  multiHost: boolean;
}

const URL_FORM = /^(postgres(?:ql)?:\/\/)(?:([^@/?#]*)@)?([^/?#]*)([^?#]*)(?:\?([^#]*))?$/;

/** Take a PostgreSQL URL apart; a `TypeError` saying how to write one when it is not. */
export function parseDatabaseUrl(raw: string): DatabaseUrl {
  const m = URL_FORM.exec(raw.trim());
  if (!m) {
    throw new TypeError(
      "not a PostgreSQL URL: write it like postgres://user@127.0.0.1:5432/dbname (several hosts: " +
        "postgres://user@host1:5432,host2:5432/dbname?target_session_attrs=read-write)",
    );
  }
  const [, scheme = "", auth, hostList = "", path = "", query] = m;
  const hosts = hostList ? hostList.split(",") : [];
  for (const h of hosts) {
    try {
      new URL(`${scheme}${h}`);
    } catch {
      throw new TypeError(`not a PostgreSQL URL: bad host ${JSON.stringify(h)} (write host or host:port)`);
    }
  }
  const params = new URLSearchParams(query ?? "");
  const pgbouncer = params.get("pgbouncer");
  params.delete("pgbouncer");
  const rest = params.toString();
  return {
    url: `${scheme}${auth !== undefined ? `${auth}@` : ""}${hostList}${path}${rest ? `?${rest}` : ""}`,
    where: `${hostList || "localhost"}${path || "/"}`,
    hosts,
    prepare: pgbouncer === "true" || pgbouncer === "1" ? false : "auto",
    multiHost: hosts.length > 1 || params.has("target_session_attrs"),
  };
}

/** Why a database could not be opened: `unreachable`, or a `pooler`, or the `server`, that answered no. */
export class DatabaseConnectError extends Error {
  /** Always `"DatabaseConnectError"`: the name logs and stack traces show. */
  override name = "DatabaseConnectError";
  /** Always `"IDEM_DATABASE_CONNECT"`: a code to check that does not depend on the class. */
  readonly code = "IDEM_DATABASE_CONNECT";
  constructor(
    /** Who said no: nothing answered, a pooler, or the PostgreSQL server. */
    readonly kind: "unreachable" | "pooler" | "server",
    /** Host(s) and database, without user or password. */
    readonly where: string,
    cause: unknown,
  ) {
    super(describeConnectFailure(kind, where, cause), { cause });
  }
}

/** Who said no: a pooler (PgBouncer's own errors), the server (any other SQLSTATE), or nobody. */
export function connectFailureKind(err: unknown): DatabaseConnectError["kind"] {
  if (poolerError(err)) return "pooler";
  return sqlStateOf(err) ? "server" : "unreachable";
}

function describeConnectFailure(kind: DatabaseConnectError["kind"], where: string, err: unknown): string {
  const message = (err as Error)?.message ?? String(err);
  if (kind === "pooler") {
    if (poolerError(err) === "prepared-statement") {
      return (
        `a transaction pooler between here and ${where} lost a named prepared statement (${message}): ` +
        `leave the driver's prepare option at "auto" (or add ?pgbouncer=true to the URL)`
      );
    }
    return (
      `the connection pooler at ${where} answered, not PostgreSQL: ${message} ` +
      `(check the pooler's configuration and that PostgreSQL behind it runs)`
    );
  }
  if (kind === "server") {
    const code = sqlStateOf(err);
    return `PostgreSQL at ${where} answered: ${message}${code ? ` (SQLSTATE ${code})` : ""}`;
  }
  return `cannot reach PostgreSQL at ${where} (${message})`;
}

/** Options of {@link openDatabaseUrl}. */
export interface OpenDatabaseUrlOptions {
  /**
   * `"pg"` (node-postgres), `"postgres"` (postgres.js), or `"auto"`: postgres.js for a URL with several
   * hosts or `target_session_attrs`, node-postgres otherwise. Default `"auto"`.
   */
  driver?: "pg" | "postgres" | "auto";
  /** Connections in the pool. Default 10. */
  max?: number;
  /** node-postgres: pipeline mode (BEGIN and the first statement in one write). Default true. */
  pipeline?: boolean;
  /** Give up on a connection attempt after this long. Default 5,000 ms. */
  connectTimeoutMs?: number;
  /**
   * A URL straight to PostgreSQL for LISTEN, when `url` goes through a transaction pooler (where LISTEN
   * never hears a thing). Default: `url` itself.
   */
  listenUrl?: string;
  /** Errors of idle pooled connections (the server restarted). Default: ignored. */
  onIdleError?: (err: Error) => void;
  /** Failures of the LISTEN connection after it first listened (it is opened again). Default: ignored. */
  onListenError?: (err: Error) => void;
}

/** What `openDatabaseUrl` opened: the `Db`, its LISTEN, the driver chosen, and where it is. */
export interface OpenedDatabaseUrl {
  /** The database. */
  db: Db;
  /** Wake-ups by LISTEN/NOTIFY (for the outbox relay); fails at subscription when only a pooler is there. */
  listen: Listen;
  /** The driver used: node-postgres, or postgres.js (several hosts, `target_session_attrs`). */
  driver: "pg" | "postgres";
  /** Host(s) and database, without user or password. */
  where: string;
}

/**
 * Open `url` and check that it answers (`SELECT 1`). A `TypeError` for a malformed URL; a
 * `DatabaseConnectError` (which says whether the server, a pooler or nobody answered) when it does not
 * answer. The driver's package (`pg` or `postgres`) must be installed.
 */
export async function openDatabaseUrl(
  url: string,
  options: OpenDatabaseUrlOptions = {},
): Promise<OpenedDatabaseUrl> {
  const parsed = parseDatabaseUrl(url);
  const driver = chooseDriver(parsed, options.driver);
  const listenAt = options.listenUrl ? parseDatabaseUrl(options.listenUrl) : undefined;
  const connectTimeoutMs = options.connectTimeoutMs ?? 5_000;
  let db: Db;
  let listen: Listen;
  if (driver === "pg") {
    const pg = (await importDriver("pg")) as typeof import("pg");
    const Pool = pg.Pool ?? (pg as unknown as { default: typeof pg }).default.Pool;
    const pool = new Pool({
      connectionString: parsed.url,
      max: options.max ?? 10,
      connectionTimeoutMillis: connectTimeoutMs,
      pipeline: options.pipeline ?? true,
    } as import("pg").PoolConfig);
    pool.on("error", options.onIdleError ?? (() => {}));
    const { fromPg } = await import("./pg.ts");
    db = fromPg(pool, { prepare: parsed.prepare });
    listen = listenAt
      ? await listenOn(listenAt, connectTimeoutMs, options.onListenError)
      : listenWithPg(() => pool.connect(), { onError: options.onListenError });
  } else {
    const sql = await postgresJs(parsed, options.max ?? 10, connectTimeoutMs);
    const { fromPostgresJs } = await import("./postgres-js.ts");
    db = fromPostgresJs(sql, { prepare: parsed.prepare });
    listen = listenAt
      ? await listenOn(listenAt, connectTimeoutMs, options.onListenError)
      : listenWithPostgresJs(sql);
  }
  try {
    await db.query("SELECT 1");
  } catch (err) {
    await db.close().catch(() => {});
    throw new DatabaseConnectError(connectFailureKind(err), parsed.where, err);
  }
  return { db, listen, driver, where: parsed.where };
}

function chooseDriver(url: DatabaseUrl, driver: OpenDatabaseUrlOptions["driver"]): "pg" | "postgres" {
  if (driver === "pg" && url.multiHost) {
    throw new TypeError(
      `node-postgres cannot follow ${url.where} (several hosts or target_session_attrs): use the postgres driver`,
    );
  }
  if (driver === "pg" || driver === "postgres") return driver;
  if (driver !== undefined && driver !== "auto") {
    throw new TypeError(`driver must be pg, postgres or auto, got ${JSON.stringify(driver)}`);
  }
  return url.multiHost ? "postgres" : "pg";
}

/**
 * postgres.js's default export, as far as idem calls it. Typed here rather than from its declarations,
 * which changed shape in 4.0 (`export =` became `export default`): the same code then type-checks
 * against either major version.
 */
type PostgresJsFactory = (
  url: string,
  options: { max: number; connect_timeout: number; onnotice: () => void },
) => PostgresJsLike & Parameters<typeof listenWithPostgresJs>[0];

async function postgresJs(url: DatabaseUrl, max: number, connectTimeoutMs: number) {
  const mod = (await importDriver("postgres")) as { default: PostgresJsFactory };
  return mod.default(url.url, {
    max,
    connect_timeout: Math.max(1, Math.ceil(connectTimeoutMs / 1000)),
    onnotice: () => {},
  });
}

/** LISTEN on a URL of its own (straight to PostgreSQL, past a pooler), with the driver its form needs. */
async function listenOn(
  url: DatabaseUrl,
  connectTimeoutMs: number,
  onError: ((err: Error) => void) | undefined,
): Promise<Listen> {
  if (url.multiHost) return listenWithPostgresJs(await postgresJs(url, 1, connectTimeoutMs));
  const pg = (await importDriver("pg")) as typeof import("pg");
  const Client = pg.Client ?? (pg as unknown as { default: typeof pg }).default.Client;
  return listenWithPg(
    async () => {
      const client = new Client({ connectionString: url.url, connectionTimeoutMillis: connectTimeoutMs });
      client.on("error", () => {}); // replaced by listenWithPg's own listener once connected
      await client.connect();
      return client;
    },
    { onError },
  );
}

async function importDriver(name: "pg" | "postgres"): Promise<unknown> {
  try {
    return await import(name);
  } catch (err) {
    if ((err as { code?: string }).code === "ERR_MODULE_NOT_FOUND") {
      throw new Error(`to reach a PostgreSQL server, install ${name}: npm install ${name}`, { cause: err });
    }
    throw err;
  }
}
