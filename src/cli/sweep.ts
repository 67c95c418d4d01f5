import { sweepInbox } from "../messaging/inbox.ts";
import { CliError, EXIT, openStore, parse, retentionMs } from "./shared.ts";

const USAGE = `usage: idem sweep [--database-url URL] [--schema NAME] [--retention-hours H] [--inbox-retention-hours H] [--json]

Retention: drops whole key partitions and inbox dedup partitions older than their windows (no row-by-row
DELETE) and creates the partitions ahead. Run it hourly from cron or a scheduler.
  --database-url URL         default: $DATABASE_URL, else the embedded .idem/pgdata
  --schema NAME              default: idem
  --retention-hours H        how long keys are kept (default: $IDEM_RETENTION_HOURS, else 24)
  --inbox-retention-hours H  how long inbox dedup marks are kept, longer than any redelivery (default 168)
  --json                     print what was dropped (the partitions' time buckets) as JSON
Exit codes: 0 done, 1 failure, 2 bad usage.`;

export async function sweepCommand(argv: string[]): Promise<number> {
  const { values } = parse(
    argv,
    {
      "database-url": { type: "string" },
      schema: { type: "string" },
      "retention-hours": { type: "string" },
      "inbox-retention-hours": { type: "string" },
      json: { type: "boolean" },
    },
    USAGE,
  );
  if (values.help) {
    console.log(USAGE);
    return EXIT.ok;
  }
  const inboxHours = Number(values["inbox-retention-hours"] ?? 168);
  if (!(inboxHours > 0)) throw new CliError("--inbox-retention-hours takes a positive number", EXIT.usage);
  const { db, where, store } = await openStore({
    url: values["database-url"] ?? process.env.DATABASE_URL,
    schema: values.schema,
    retentionMs: retentionMs(values["retention-hours"]),
  });
  try {
    const { dropped } = await store.sweep();
    const inbox = await sweepInbox(db, { retentionMs: inboxHours * 3_600_000, schema: values.schema });
    if (values.json) {
      console.log(
        JSON.stringify({ database: where, keyPartitions: dropped, inboxPartitions: inbox.dropped }),
      );
    } else {
      console.log(
        `dropped ${dropped.length} expired key partition(s) and ${inbox.dropped.length} inbox partition(s) on ${where}`,
      );
    }
    return EXIT.ok;
  } finally {
    await db.close();
  }
}
