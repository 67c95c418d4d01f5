import { type ParseArgsConfig, parseArgs } from "node:util";
import type { Db } from "../postgres/db.ts";
import type { Listen } from "../postgres/drivers/listen.ts";
import type { PostgresStore } from "../postgres/store.ts";

/** Exit codes scripts can rely on. */
export const EXIT = { ok: 0, failure: 1, usage: 2 } as const;

/** A failure the user can fix: printed as one line, `idem: <message>`. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode: number = EXIT.failure,
  ) {
    super(message);
  }
}

/**
 * Text from the database (or a user) made safe to print: control characters (C0, DEL, C1), line and
 * paragraph separators and bidirectional overrides are written as `\uXXXX`, so a stored key or scope
 * can never move the cursor, recolour, retitle or reorder the operator's terminal. The same escapes are
 * valid inside JSON strings, so JSON output stays JSON. `lines`: keep the line breaks of a multi-line
 * text we laid out ourselves (the values in it must have been escaped already, or be JSON).
 */
export function printable(text: string, options: { lines?: boolean } = {}): string {
  return text.replace(UNPRINTABLE, (c) =>
    options.lines && c === "\n" ? c : `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
const UNPRINTABLE = /[\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

/** Print a value as indented JSON, with whatever JSON leaves raw (C1, bidi overrides) escaped too. */
export function printJson(value: unknown): void {
  console.log(printable(JSON.stringify(value, null, 2), { lines: true }));
}

type WithHelp<T> = T & { help: { type: "boolean"; short: "h" } };

export function parse<T extends NonNullable<ParseArgsConfig["options"]>>(
  argv: string[],
  options: T,
  usage: string,
): ReturnType<typeof parseArgs<{ args: string[]; options: WithHelp<T>; allowPositionals: true }>> {
  try {
    return parseArgs({
      args: argv,
      options: { ...options, help: { type: "boolean", short: "h" } } as WithHelp<T>,
      allowPositionals: true,
    });
  } catch (err) {
    // One line, never Node's multi-line parser message: its first sentence, and where the options are.
    const command = /^usage: (idem \S+)/.exec(usage)?.[1] ?? "idem";
    const first = String((err as Error).message)
      .split("\n")[0]!
      .split(/\.(\s|$)/)[0]!;
    const option = /'(--[a-z-]+)'/.exec(first)?.[1];
    const hint = /ambiguous/.test(first) && option ? `; write a negative value as ${option}=-1` : "";
    throw new CliError(`${first}${hint} (${command} --help shows every option)`, EXIT.usage);
  }
}

/**
 * Open the database named by --database-url or DATABASE_URL (node-postgres; postgres.js for a URL with
 * several hosts or target_session_attrs), or the embedded PGlite under .idem/pgdata when neither is
 * set (the same default as `npm start`). `listenUrl`: a direct URL for LISTEN past a pooler.
 */
export async function openDb(
  url: string | undefined,
  options: { listenUrl?: string; onListenError?: (err: Error) => void } = {},
): Promise<{ db: Db; where: string; listen?: Listen }> {
  if (!url) {
    // Checked before anything touches the disk: without PGlite there is no embedded database to create.
    await importPeer("@electric-sql/pglite", "set DATABASE_URL to a PostgreSQL server, or");
    const { DataDirInUseError, openPgliteDir } = await import("../postgres/drivers/pglite.ts");
    const dir = process.env.IDEM_DATA_DIR ?? ".idem/pgdata";
    let db: Db;
    try {
      ({ db } = await openPgliteDir(dir));
    } catch (err) {
      if (err instanceof DataDirInUseError) throw new CliError(err.message);
      throw err;
    }
    return { db, where: `embedded PGlite in ${dir}` };
  }
  const { DatabaseConnectError, openDatabaseUrl, parseDatabaseUrl } = await import(
    "../postgres/drivers/connect.ts"
  );
  for (const [u, name] of [
    [url, "DATABASE_URL"],
    [options.listenUrl, "IDEM_LISTEN_DATABASE_URL"],
  ] as const) {
    if (!u) continue;
    let multiHost: boolean;
    try {
      multiHost = parseDatabaseUrl(u).multiHost;
    } catch (err) {
      throw new CliError(`${name} is ${(err as Error).message}`);
    }
    await importPeer(multiHost ? "postgres" : "pg", "to reach a PostgreSQL server,");
  }
  try {
    // An idle connection cut by a server restart must not crash the command with an unheard 'error'
    // event (openDatabaseUrl listens); the statement that needs it fails with its own error.
    const { db, where, listen } = await openDatabaseUrl(url, { max: 4, ...options });
    return { db, where, listen };
  } catch (err) {
    if (err instanceof DatabaseConnectError) {
      const missing = missingDatabase(err.cause, url);
      if (missing) throw missing;
      throw new CliError(
        err.kind === "unreachable" ? `${err.message}: start the server or fix DATABASE_URL` : err.message,
      );
    }
    throw err;
  }
}

/**
 * The one line for a server that answered that the database does not exist (SQLSTATE 3D000), told apart
 * from a server that could not be reached; undefined for any other failure.
 */
export function missingDatabase(err: unknown, databaseUrl: string): CliError | undefined {
  if ((err as { code?: unknown } | null)?.code !== "3D000") return undefined;
  const url = new URL(databaseUrl);
  const name = decodeURIComponent(url.pathname.slice(1)) || url.username || "postgres";
  const port = url.port || "5432";
  return new CliError(
    `database "${name}" does not exist on the PostgreSQL server at ${url.host}: create it ` +
      `(createdb -h ${url.hostname} -p ${port} ${name}) or fix DATABASE_URL`,
  );
}

/**
 * Import an optional peer dependency, or fail with one line that says what to install (instead of
 * Node's ERR_MODULE_NOT_FOUND stack).
 */
async function importPeer(name: string, why: string): Promise<unknown> {
  try {
    return await import(name);
  } catch (err) {
    if ((err as { code?: string }).code === "ERR_MODULE_NOT_FOUND") {
      throw new CliError(`${why} install ${name}: npm install ${name}`);
    }
    throw err;
  }
}

/** `--retention-hours` (or IDEM_RETENTION_HOURS, default 24) as milliseconds; a usage error otherwise. */
export function retentionMs(flag: string | undefined): number {
  const hours = Number(flag ?? process.env.IDEM_RETENTION_HOURS ?? 24);
  if (!(hours > 0)) throw new CliError("--retention-hours takes a positive number", EXIT.usage);
  return hours * 3_600_000;
}

/**
 * Open the database (see `openDb`) and idem's store in it. A missing schema becomes a one-line error
 * that says to run `idem migrate`. The caller closes `db`.
 */
export async function openStore(options: {
  url: string | undefined;
  schema?: string;
  retentionMs: number;
}): Promise<{ db: Db; where: string; store: PostgresStore }> {
  const { db, where } = await openDb(options.url);
  const { PostgresStore } = await import("../postgres/store.ts");
  try {
    // The service's encryption keys, when set, so that sealed headers and inputs can be shown.
    const { sealerFromEnv } = await import("../core/sealing.ts");
    const store = await PostgresStore.open(db, {
      schema: options.schema,
      retentionMs: options.retentionMs,
      sealer: sealerFromEnv(),
    });
    return { db, where, store };
  } catch (err) {
    await db.close().catch(() => {});
    throw new CliError((err as Error).message);
  }
}
