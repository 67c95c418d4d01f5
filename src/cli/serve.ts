import { CliError, EXIT, parse } from "./shared.ts";

// The reference service lives in app/ (shipped with the package); imported lazily by URL so that the
// library build (rootDir src/) does not compile it.
const APP_MAIN = new URL("../../app/main.ts", import.meta.url).href;
const APP_ACCOUNTS = new URL("../../app/accounts.ts", import.meta.url).href;
const APP_DATABASE = new URL("../../app/database.ts", import.meta.url).href;

const SERVE_USAGE = `usage: idem serve [--port N] [--host H] [--database-url URL]

Runs the reference payments service.
  --port N             default: $PORT, else 3000
  --host H             default: $HOST, else 127.0.0.1
  --database-url URL   default: $DATABASE_URL, else the embedded PGlite in .idem/pgdata
Environment: IDEM_DEMO=1 creates the demo accounts on a real server; IDEM_RETENTION_HOURS (default 24).
Exit codes: 0 stopped cleanly, 1 failure, 2 bad usage.`;

export async function serveCommand(argv: string[]): Promise<number> {
  const { values } = parse(
    argv,
    { port: { type: "string" }, host: { type: "string" }, "database-url": { type: "string" } },
    SERVE_USAGE,
  );
  if (values.help) {
    console.log(SERVE_USAGE);
    return EXIT.ok;
  }
  const env = { ...process.env };
  if (values.port) env.PORT = values.port;
  if (values.host) env.HOST = values.host;
  if (values["database-url"]) env.DATABASE_URL = values["database-url"];
  const { start } = (await import(APP_MAIN)) as typeof import("../../app/main.ts");
  const { stop } = await start(env).catch((e: Error) => {
    throw new CliError(e.message);
  });
  await new Promise<void>((resolve) => {
    for (const sig of ["SIGINT", "SIGTERM"] as const) process.once(sig, () => resolve());
  });
  await stop();
  return EXIT.ok;
}

const ACCOUNTS_USAGE = `usage: idem accounts create --name NAME [--database-url URL]

Creates an account and prints its API key once (only its SHA-256 is stored).
  --database-url URL   default: $DATABASE_URL, else the embedded .idem/pgdata
Exit codes: 0 created, 1 failure, 2 bad usage.`;

export async function accountsCommand(argv: string[]): Promise<number> {
  const { values, positionals } = parse(
    argv,
    { name: { type: "string" }, "database-url": { type: "string" } },
    ACCOUNTS_USAGE,
  );
  if (values.help) {
    console.log(ACCOUNTS_USAGE);
    return EXIT.ok;
  }
  if (positionals[0] !== "create" || !values.name) throw new CliError(ACCOUNTS_USAGE, EXIT.usage);
  const { openDb } = await import("./shared.ts");
  const { db } = await openDb(values["database-url"] ?? process.env.DATABASE_URL);
  try {
    const { prepareSchema } = (await import(APP_DATABASE)) as typeof import("../../app/database.ts");
    const { createAccount } = (await import(APP_ACCOUNTS)) as typeof import("../../app/accounts.ts");
    await prepareSchema(db);
    const { id, apiKey } = await createAccount(db, values.name);
    console.log(`account ${id}\napi key ${apiKey}  (shown once: store it now)`);
    return EXIT.ok;
  } finally {
    await db.close();
  }
}
