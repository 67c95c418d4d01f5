import { SqlState, sqlStateOf } from "../core/sqlstate.ts";
import { sweepInbox } from "../messaging/inbox.ts";
import { PartitionMissingError, partitionsAhead } from "../postgres/schema/partitions.ts";
import { CliError, EXIT, openStore, parse, retentionMs } from "./shared.ts";

const USAGE = `usage: idem sweep [--database-url URL] [--schema NAME] [--retention-hours H] [--inbox-retention-hours H] [--json]

Retention: drops whole key partitions and inbox dedup partitions older than their windows (no row-by-row
DELETE) and creates the partitions ahead (48 hours, at least two partitions), which the service's role
(DML only) cannot. Run it hourly from cron or a scheduler, as the owner of idem's tables.
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
    let dropped: number[];
    let inbox: { dropped: number[] };
    try {
      ({ dropped } = await store.sweep());
      inbox = await sweepInbox(db, { retentionMs: inboxHours * 3_600_000, schema: values.schema });
    } catch (err) {
      if (err instanceof PartitionMissingError || sqlStateOf(err) === SqlState.InsufficientPrivilege) {
        const why =
          err instanceof PartitionMissingError ? (err.cause as Error).message : (err as Error).message;
        throw new CliError(
          `this role may not create or drop idem's partitions (${why}): run idem sweep as the owner of idem's tables`,
        );
      }
      throw err;
    }
    const ahead = store.partitions.startOf(
      store.partitions.bucketOf(Date.now()) +
        partitionsAhead(store.partitions.widthMs, store.retentionMs) +
        1,
    );
    const until = new Date(ahead).toISOString();
    if (values.json) {
      console.log(
        JSON.stringify({
          database: where,
          keyPartitions: dropped,
          inboxPartitions: inbox.dropped,
          partitionsUntil: until,
        }),
      );
    } else {
      console.log(
        `dropped ${dropped.length} expired key partition(s) and ${inbox.dropped.length} inbox partition(s) on ${where}; partitions made until ${until}`,
      );
    }
    return EXIT.ok;
  } finally {
    await db.close();
  }
}
