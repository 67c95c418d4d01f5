import { PostgresStore } from "../postgres/store.ts";
import { CliError, EXIT, openDb, parse } from "./shared.ts";

const USAGE = `usage: idem sweep [--database-url URL] [--schema NAME] [--retention-hours H]

Retention: drops whole key partitions older than the window (no row-by-row DELETE) and creates the
partitions ahead. Run it hourly from cron or a scheduler.
  --database-url URL   default: $DATABASE_URL, else the embedded .idem/pgdata
  --schema NAME        default: idem
  --retention-hours H  how long keys are kept (default: $IDEM_RETENTION_HOURS, else 24)
Exit codes: 0 done, 1 failure, 2 bad usage.`;

export async function sweepCommand(argv: string[]): Promise<number> {
  const { values } = parse(
    argv,
    { "database-url": { type: "string" }, schema: { type: "string" }, "retention-hours": { type: "string" } },
    USAGE,
  );
  if (values.help) {
    console.log(USAGE);
    return EXIT.ok;
  }
  const hours = Number(values["retention-hours"] ?? process.env.IDEM_RETENTION_HOURS ?? 24);
  if (!(hours > 0)) throw new CliError("--retention-hours takes a positive number", EXIT.usage);
  const { db, where } = await openDb(values["database-url"] ?? process.env.DATABASE_URL);
  try {
    const store = await PostgresStore.open(db, {
      schema: values.schema,
      retentionMs: hours * 3_600_000,
    }).catch((e) => {
      throw new CliError(`${(e as Error).message}`);
    });
    const { dropped } = await store.sweep();
    console.log(`dropped ${dropped.length} expired partition(s) on ${where}`);
    return EXIT.ok;
  } finally {
    await db.close();
  }
}
