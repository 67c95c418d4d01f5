import { migrate, pendingMigrations } from "../postgres/migrate.ts";
import { CliError, EXIT, openDb, parse } from "./shared.ts";

const USAGE = `usage: idem migrate [--database-url URL] [--schema NAME] [--partition-seconds N] [--check] [--json]

Applies idem's numbered SQL migrations (safe when several instances run it at once).
  --database-url URL      PostgreSQL to migrate (default: $DATABASE_URL, else the embedded .idem/pgdata)
  --schema NAME           schema for idem's tables (default: idem)
  --partition-seconds N   width of a key partition, fixed at creation (default: 86400)
  --check                 apply nothing; exit 1 when migrations are pending
  --json                  print {"applied": [...]} (or {"pending": [...]} with --check) as JSON
Exit codes: 0 done (or up to date), 1 failure or pending with --check, 2 bad usage.`;

export async function migrateCommand(argv: string[]): Promise<number> {
  const { values } = parse(
    argv,
    {
      "database-url": { type: "string" },
      schema: { type: "string" },
      "partition-seconds": { type: "string" },
      check: { type: "boolean" },
      json: { type: "boolean" },
    },
    USAGE,
  );
  if (values.help) {
    console.log(USAGE);
    return EXIT.ok;
  }
  const partitionSeconds = values["partition-seconds"] ? Number(values["partition-seconds"]) : undefined;
  if (partitionSeconds !== undefined && !(Number.isInteger(partitionSeconds) && partitionSeconds >= 60)) {
    throw new CliError("--partition-seconds takes a whole number of seconds, at least 60", EXIT.usage);
  }
  const { db, where } = await openDb(values["database-url"] ?? process.env.DATABASE_URL);
  try {
    if (values.check) {
      const pending = await pendingMigrations(db, { schema: values.schema });
      if (values.json) console.log(JSON.stringify({ database: where, pending }));
      else if (pending.length) {
        console.log(`${pending.length} pending on ${where}: ${pending.join(", ")} (run: idem migrate)`);
      } else console.log(`up to date on ${where}`);
      return pending.length ? EXIT.failure : EXIT.ok;
    }
    const { applied } = await migrate(db, { schema: values.schema, partitionSeconds });
    if (values.json) console.log(JSON.stringify({ database: where, applied }));
    else console.log(applied.length ? `applied ${applied.join(", ")} on ${where}` : `up to date on ${where}`);
    return EXIT.ok;
  } finally {
    await db.close();
  }
}
