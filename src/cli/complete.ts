import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { type CompleteReport, complete } from "../postgres/admin/complete.ts";
import type { Db } from "../postgres/db.ts";
import type { PhasesRunner } from "../postgres/phases/index.ts";
import type { PostgresStore } from "../postgres/store.ts";
import { CliError, EXIT, openStore, parse, printable, printJson, retentionMs } from "./shared.ts";

const USAGE = `usage: idem complete --module PATH [--database-url URL] [--schema NAME] [--older-than S]
                     [--limit N] [--retention-hours H] [--dry-run] [--json]

Finishes phases-mode requests abandoned mid-way (the worker crashed, the client never retried): each
unfinished key whose lease is free is resumed by its runner from its recovery point, with the request
stored at the claim. Run it periodically, e.g. every minute.
  --module PATH        a module exporting the runners: \`idemRunners({ db, store })\` returning an array
                       of definePhases() runners, or an array \`runners\` (e.g. app/payments-phases.ts)
  --database-url URL   default: $DATABASE_URL, else the embedded .idem/pgdata
  --schema NAME        default: idem
  --older-than S       only keys idle for S seconds (default: 60)
  --limit N            at most N keys per run (default: 100)
  --retention-hours H  as configured for the service (default: $IDEM_RETENTION_HOURS, else 24)
  --dry-run            list what would be resumed; run nothing
  --json               print the report as JSON
Exit codes: 0 done (keys still in flight or retryable are left for the next run), 1 failure (a key
failed, or no runner was given for it), 2 bad usage.`;

type RunnersModule = {
  idemRunners?: (deps: {
    db: Db;
    store: PostgresStore;
  }) => PhasesRunner<any, any>[] | Promise<PhasesRunner<any, any>[]>;
  runners?: PhasesRunner<any, any>[];
};

export async function completeCommand(argv: string[]): Promise<number> {
  const { values } = parse(
    argv,
    {
      module: { type: "string" },
      "database-url": { type: "string" },
      schema: { type: "string" },
      "older-than": { type: "string" },
      limit: { type: "string" },
      "retention-hours": { type: "string" },
      "dry-run": { type: "boolean" },
      json: { type: "boolean" },
    },
    USAGE,
  );
  if (values.help) {
    console.log(USAGE);
    return EXIT.ok;
  }
  if (!values.module) throw new CliError(`--module is required\n${USAGE}`, EXIT.usage);
  const olderThan = Number(values["older-than"] ?? 60);
  if (!(olderThan >= 0)) throw new CliError("--older-than takes seconds (0 or more)", EXIT.usage);
  const limit = Number(values.limit ?? 100);
  if (!(Number.isInteger(limit) && limit > 0))
    throw new CliError("--limit takes a positive whole number", EXIT.usage);
  const retention = retentionMs(values["retention-hours"]);

  let mod: RunnersModule;
  try {
    mod = (await import(pathToFileURL(resolve(values.module)).href)) as RunnersModule;
  } catch (err) {
    throw new CliError(`cannot load --module ${values.module}: ${(err as Error).message}`);
  }
  if (typeof mod.idemRunners !== "function" && !Array.isArray(mod.runners)) {
    throw new CliError(`${values.module} exports neither idemRunners({ db, store }) nor an array runners`);
  }

  const { db, where, store } = await openStore({
    url: values["database-url"] ?? process.env.DATABASE_URL,
    schema: values.schema,
    retentionMs: retention,
  });
  try {
    const runners = mod.idemRunners ? await mod.idemRunners({ db, store }) : mod.runners!;
    const report = await complete({
      store,
      runners,
      olderThanMs: olderThan * 1000,
      limit,
      dryRun: values["dry-run"] ?? false,
    });
    print(report, where, values.json ?? false);
    return report.counts.failed > 0 || report.counts["no-runner"] > 0 ? EXIT.failure : EXIT.ok;
  } finally {
    await db.close();
  }
}

function print(report: CompleteReport, where: string, json: boolean): void {
  if (json) {
    printJson(report);
    return;
  }
  for (const r of report.results) {
    const status = r.status !== undefined ? ` -> ${r.status}` : "";
    const error = r.error ? ` (${r.error})` : "";
    console.log(
      printable(
        `${r.result.padEnd(10)} ${r.scope} ${r.key} [${r.runner ?? "?"} at ${r.point}]${status}${error}`,
      ),
    );
  }
  const counts = Object.entries(report.counts)
    .filter(([, n]) => n > 0)
    .map(([k, n]) => `${n} ${k}`)
    .join(", ");
  console.log(`${report.found} unfinished key(s) on ${where}${counts ? `: ${counts}` : ""}`);
}
