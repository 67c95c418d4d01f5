import { migrate, pendingMigrations, SchemaBehindError } from "../postgres/schema/migrate.ts";
import { CliError, EXIT, openDb, parse } from "./shared.ts";

const USAGE = `usage: idem migrate [--database-url URL] [--schema NAME] [--partition-seconds N] [--runtime-role ROLE]
                    [--outbox-notify on|off] [--check] [--json]

Applies idem's numbered SQL migrations (safe when several instances run it at once) and makes the
partitions ahead. Run it as the role that owns idem's tables (a migration job), not as the service.
  --database-url URL      PostgreSQL to migrate (default: $DATABASE_URL, else the embedded .idem/pgdata)
  --schema NAME           schema for idem's tables (default: idem)
  --partition-seconds N   width of a key partition, fixed at creation (default: 86400)
  --runtime-role ROLE     grant ROLE (the running service's) what idem needs at run time: DML on its
                          tables, now and for partitions made later; nothing that allows DDL
  --outbox-notify on|off  keep or drop the trigger that NOTIFYs relays from inside the transactions
                          that write events without idem's drivers; off lets those commit side by
                          side, and relays poll for their events (default: leave it as it is)
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
      "runtime-role": { type: "string" },
      "outbox-notify": { type: "string" },
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
  const notify = values["outbox-notify"];
  if (notify !== undefined && notify !== "on" && notify !== "off") {
    throw new CliError("--outbox-notify takes on or off", EXIT.usage);
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
    const role = values["runtime-role"];
    if (role !== undefined && !role) throw new CliError("--runtime-role takes a role name", EXIT.usage);
    let result: Awaited<ReturnType<typeof migrate>>;
    try {
      result = await migrate(db, {
        schema: values.schema,
        partitionSeconds,
        runtimeRole: role,
        ...(notify ? { outboxNotify: notify === "on" } : {}),
      });
    } catch (err) {
      const message = (err as Error).message;
      if (err instanceof SchemaBehindError || /^role .* does not exist|^outboxNotify: /.test(message)) {
        throw new CliError(message);
      }
      throw err;
    }
    const { applied, runtimeRoleExtras } = result;
    if (values.json) {
      console.log(JSON.stringify({ database: where, applied, runtimeRole: role, runtimeRoleExtras }));
      return EXIT.ok;
    }
    console.log(applied.length ? `applied ${applied.join(", ")} on ${where}` : `up to date on ${where}`);
    if (notify === "off")
      console.log(
        "outbox NOTIFY trigger dropped: relays find events written without idem's drivers by polling (pollMs)",
      );
    if (notify === "on") console.log("outbox NOTIFY trigger in place: listening relays wake on each commit");
    if (role !== undefined) {
      console.log(`granted ${role} what idem needs at run time (DML on schema ${values.schema ?? "idem"})`);
      if (runtimeRoleExtras?.length) {
        console.log(`note: ${role} can still do more than DML: ${runtimeRoleExtras.join(", ")}`);
      }
    }
    return EXIT.ok;
  } finally {
    await db.close();
  }
}
