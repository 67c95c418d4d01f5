/**
 * The reference service's own commands (they start or change the service, so they live with it, not in
 * the library's `idem` command):
 *
 *   npm run payments -- serve [--port N] [--host H] [--database-url URL]
 *   npm run payments -- migrate [--runtime-role ROLE] [--database-url URL]
 *   npm run payments -- accounts create --name NAME [--database-url URL]
 *   npm run payments -- accounts revoke --api-key KEY [--database-url URL]
 *   npm run -s payments -- mcp --api-key KEY [--database-url URL]
 *
 * Exit codes as idem's: 0 success, 1 failure, 2 bad usage; errors are one line with the fix.
 */
import { parseArgs } from "node:util";
import { createAccount, revokeApiKey } from "./accounts.ts";
import { ensureSchema, openDatabase, prepareSchema } from "./database.ts";
import { start } from "./main.ts";
import { serveMcpStdio } from "./mcp-stdio.ts";

const USAGE = `usage: npm run payments -- <command> [options]

  serve [--port N] [--host H] [--database-url URL]
        run the reference payments service (the same as npm start; PORT, HOST, DATABASE_URL)
  migrate [--runtime-role ROLE] [--database-url URL]
        as the owner: idem's migrations and the service's tables; with ROLE, grant the role the
        service runs as DML on them (nothing that allows DDL)
  accounts create --name NAME [--database-url URL]
        create an account and print its API key once (only its SHA-256 is stored)
  accounts revoke --api-key KEY [--database-url URL]
        revoke an API key: new requests get 401 within 30 s, replays of saved answers at once
  mcp --api-key KEY [--database-url URL]
        the payments API as MCP tools on stdin/stdout, as the account of KEY (or IDEM_API_KEY);
        run it with npm run -s (npm's own lines would break the protocol): see docs/mcp.md

Exit codes: 0 success, 1 failure, 2 bad usage.`;

class UsageError extends Error {}

async function main(argv: string[]): Promise<number> {
  let parsed: ReturnType<
    typeof parseArgs<{
      options: {
        port: { type: "string" };
        host: { type: "string" };
        "database-url": { type: "string" };
        name: { type: "string" };
        "api-key": { type: "string" };
        "runtime-role": { type: "string" };
        help: { type: "boolean"; short: "h" };
      };
      allowPositionals: true;
    }>
  >;
  try {
    parsed = parseArgs({
      args: argv,
      options: {
        port: { type: "string" },
        host: { type: "string" },
        "database-url": { type: "string" },
        name: { type: "string" },
        "api-key": { type: "string" },
        "runtime-role": { type: "string" },
        help: { type: "boolean", short: "h" },
      },
      allowPositionals: true,
    });
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const { values, positionals } = parsed;
  const [command, sub] = positionals;
  if (values.help || !command) {
    console.log(USAGE);
    return command || values.help ? 0 : 2;
  }
  const env = { ...process.env };
  if (values["database-url"]) env.DATABASE_URL = values["database-url"];
  if (command === "serve") {
    if (values.port !== undefined) env.PORT = values.port;
    if (values.host !== undefined) env.HOST = values.host;
    const service = await start(env);
    await new Promise<void>((resolve) => {
      for (const sig of ["SIGINT", "SIGTERM"] as const) process.once(sig, () => resolve());
    });
    await service.stop();
    return 0;
  }
  if (command === "mcp") {
    const apiKey = values["api-key"] ?? env.IDEM_API_KEY;
    if (!apiKey)
      throw new UsageError("mcp needs --api-key KEY (or IDEM_API_KEY): the account the tools act for");
    return serveMcpStdio(env, apiKey);
  }
  if (command === "migrate") {
    const { db, where } = await openDatabase({
      url: env.DATABASE_URL || undefined,
      dataDir: env.IDEM_DATA_DIR,
    });
    try {
      const role = values["runtime-role"];
      const extras = await prepareSchema(db, role ? { runtimeRole: role } : {});
      console.log(`schema up to date on ${where}`);
      if (role) {
        console.log(`granted ${role} DML on idem's and the service's tables`);
        if (extras.length) console.log(`note: ${role} can still do more than DML: ${extras.join(", ")}`);
      }
      return 0;
    } finally {
      await db.close();
    }
  }
  if (command === "accounts" && (sub === "create" || sub === "revoke")) {
    if (sub === "create" && !values.name) throw new UsageError("accounts create needs --name NAME");
    if (sub === "revoke" && !values["api-key"]) throw new UsageError("accounts revoke needs --api-key KEY");
    const { db } = await openDatabase({ url: env.DATABASE_URL || undefined, dataDir: env.IDEM_DATA_DIR });
    try {
      await ensureSchema(db);
      if (sub === "revoke") {
        if (await revokeApiKey(db, values["api-key"]!)) {
          console.log("api key revoked");
          return 0;
        }
        console.error("idem-payments: no such API key (already revoked, or mistyped)");
        return 1;
      }
      const { id, apiKey } = await createAccount(db, values.name!);
      console.log(`account ${id}\napi key ${apiKey}  (shown once: store it now)`);
      return 0;
    } finally {
      await db.close();
    }
  }
  throw new UsageError(`unknown command "${positionals.join(" ")}"`);
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    if (err instanceof UsageError) {
      console.error(`idem-payments: ${err.message} (try: npm run payments -- --help)`);
      process.exitCode = 2;
      return;
    }
    console.error(`idem-payments: ${(err as Error)?.message ?? err}`);
    process.exitCode = 1;
  },
);
