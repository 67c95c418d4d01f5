import { readFile, writeFile } from "node:fs/promises";
import { recordAction } from "../postgres/admin/admin-actions.ts";
import { type AuditCheck, audit, auditMetrics, builtinChecks, parseChecks } from "../postgres/admin/audit.ts";
import { CliError, EXIT, openDb, parse, printable, printJson, retentionMs } from "./shared.ts";

const USAGE = `usage: idem audit [--sql FILE]... [--no-builtin] [--lease-seconds S] [--max-leases N]
                  [--review-max-hours H] [--retention-hours H] [--limit N] [--metrics FILE] [--json]
                  [--record [--by NAME]] [--database-url URL] [--schema NAME]

Checks invariants on a (production) database, each with a read-only query that returns the rows
violating it, and prints the violations. Suitable for cron: exits 1 when any check has violations.
Built-in checks (idem's tables):
  one-answer-per-key       at most one saved answer per live key
  unfinished-past-leases   no key unfinished (and not in review) for more than N leases
  review-too-old           no key waits for a person (needs_review) longer than H hours
  --sql FILE             your own checks: each starts with \`-- name: <name>\`, then optional \`-- text\`
                         lines (its description), then a query returning the violating rows
  --no-builtin           run only the --sql checks
  --lease-seconds S      the phases runners' lease (default: 30)
  --max-leases N         (default: 10)
  --review-max-hours H   (default: 24)
  --retention-hours H    as configured for the service (default: $IDEM_RETENTION_HOURS, else 24)
  --limit N              violating rows printed per check (default: 20)
  --metrics FILE         also write the counts as Prometheus text (idem_audit_violations{check=...}),
                         e.g. into node_exporter's textfile directory
  --json                 print the results as JSON
  --record               also record the run in <schema>.admin_actions (as audit.run, by --by NAME,
                         default "idem audit"): the operations console shows the last recorded run
Exit codes: 0 every check holds, 1 violations found (or a check failed to run), 2 bad usage.`;

export async function auditCommand(argv: string[]): Promise<number> {
  const { values } = parse(
    argv,
    {
      sql: { type: "string", multiple: true },
      "no-builtin": { type: "boolean" },
      "lease-seconds": { type: "string" },
      "max-leases": { type: "string" },
      "review-max-hours": { type: "string" },
      "retention-hours": { type: "string" },
      limit: { type: "string" },
      metrics: { type: "string" },
      json: { type: "boolean" },
      record: { type: "boolean" },
      by: { type: "string" },
      "database-url": { type: "string" },
      schema: { type: "string" },
    },
    USAGE,
  );
  if (values.help) {
    console.log(USAGE);
    return EXIT.ok;
  }
  const positive = (flag: string, v: string | undefined, fallback: number) => {
    const n = Number(v ?? fallback);
    if (!(n > 0)) throw new CliError(`--${flag} takes a positive number`, EXIT.usage);
    return n;
  };
  const leaseMs = positive("lease-seconds", values["lease-seconds"], 30) * 1000;
  const maxLeases = positive("max-leases", values["max-leases"], 10);
  const reviewMaxAgeMs = positive("review-max-hours", values["review-max-hours"], 24) * 3_600_000;
  const limit = Math.floor(positive("limit", values.limit, 20));
  const checks: AuditCheck[] = values["no-builtin"]
    ? []
    : builtinChecks({
        schema: values.schema,
        retentionMs: retentionMs(values["retention-hours"]),
        leaseMs,
        maxLeases,
        reviewMaxAgeMs,
      });
  for (const file of values.sql ?? []) {
    let text: string;
    try {
      text = await readFile(file, "utf8");
    } catch (err) {
      throw new CliError(`cannot read --sql ${file}: ${(err as Error).message}`, EXIT.usage);
    }
    try {
      checks.push(...parseChecks(text));
    } catch (err) {
      throw new CliError(`${file}: ${(err as Error).message}`, EXIT.usage);
    }
  }
  if (checks.length === 0)
    throw new CliError("no checks to run: drop --no-builtin or give --sql FILE", EXIT.usage);

  const { db, where } = await openDb(values["database-url"] ?? process.env.DATABASE_URL);
  try {
    let results: Awaited<ReturnType<typeof audit>>;
    try {
      results = await audit(db, checks, { limit });
    } catch (err) {
      throw new CliError(`a check failed to run on ${where}: ${(err as Error).message}`);
    }
    if (values.metrics) await writeFile(values.metrics, auditMetrics(results));
    if (values.record) {
      await recordAction(
        db,
        { actor: values.by ?? "idem audit", action: "audit.run", details: { results } },
        { schema: values.schema },
      );
    }
    const failed = results.filter((r) => r.violations > 0);
    if (values.json) printJson({ database: where, results });
    else {
      for (const r of results) {
        console.log(
          `${r.violations === 0 ? "ok       " : "VIOLATED "} ${r.name}: ${r.description}${r.violations ? ` (${r.violations} row(s))` : ""}`,
        );
        for (const row of r.rows) console.log(printable(`    ${JSON.stringify(row)}`));
      }
      console.log(
        `${checks.length} check(s) on ${where}: ${failed.length === 0 ? "all hold" : `${failed.length} violated`}`,
      );
    }
    return failed.length === 0 ? EXIT.ok : EXIT.failure;
  } finally {
    await db.close();
  }
}
