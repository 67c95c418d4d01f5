import { readFile } from "node:fs/promises";
import type { Db } from "../postgres/db.ts";
import { FindingKind, type ServiceRecord } from "../reconcile/compare.ts";
import { isReconcileError } from "../reconcile/errors.ts";
import { httpRefunder } from "../reconcile/http-refunds.ts";
import { type ReconcileReport, reconcile, recordsFromSql } from "../reconcile/reconcile.ts";
import { parseMapping, parseReport, type ReportMapping } from "../reconcile/report.ts";
import { CliError, EXIT, openDb, openStore, parse, printable, printJson, retentionMs } from "./shared.ts";

const USAGE = `usage: idem reconcile --config FILE --report FILE|URL [--from TIME] [--to TIME]
                      [--refund-url URL] [--auto-refund-up-to N] [--review] [--json]
                      [--records-database-url URL]... [--database-url URL] [--schema NAME] [--by NAME]

Compares the payment provider's charges report with the service's records for a window, joined by the
downstream idempotency reference, records each difference once (idem.reconcile_findings) and acts on it:
  duplicate        a reference (or one operation) charged more than once
  orphan           a charge with no record
  missing          a record the provider never charged
  amount-mismatch  the charge and the record disagree on the amount
A finding is refunded at the provider exactly once (keyed like any other effect) when the operator
allows it, or waits for a person in the console's review queue. Every run also finishes earlier runs'
refunds and picks up reviews settled since. Suitable for cron (docs/reconcile.md).
  --config FILE            JSON: "report" (the mapping: format, amountUnit, columns {reference, amount,
                           currency, time, id, status, refunded}), "records" (SQL returning reference,
                           amount, currency, at [, id, scope, operation] for $1 <= time < $2), and
                           optionally "autoRefund" {maxAmount, kinds} and "review" (true or kinds)
  --report FILE|URL        the provider's export; in a URL, {from} and {to} are replaced by the window
                           widened by 10 minutes on each side
  --from, --to TIME        the window, ISO 8601 (default: yesterday, 00:00 to 00:00 UTC)
  --refund-url URL         refund through this Stripe-shaped API (POST /v1/refunds; IDEM_PROVIDER_API_KEY
                           is sent as the bearer key); without it nothing is refunded
  --auto-refund-up-to N    refund duplicates and orphans up to N minor units each without a person
  --review                 open a review for every finding not refunded
  --records-database-url   read the records from this database instead (repeat it for several regions)
  --json                   print the report as JSON
Exit codes: 0 no difference left open, 1 differences wait for a person (or failed), 2 bad usage.`;

interface Config {
  report: ReportMapping;
  records: string;
  autoRefund?: { maxAmount: number; kinds?: FindingKind[] };
  review?: boolean | FindingKind[];
}

export async function reconcileCommand(argv: string[]): Promise<number> {
  const { values } = parse(
    argv,
    {
      config: { type: "string" },
      report: { type: "string" },
      from: { type: "string" },
      to: { type: "string" },
      "refund-url": { type: "string" },
      "auto-refund-up-to": { type: "string" },
      review: { type: "boolean" },
      "records-database-url": { type: "string", multiple: true },
      json: { type: "boolean" },
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
  if (!values.config)
    throw new CliError("give --config FILE (the report's mapping and the records query)", EXIT.usage);
  if (!values.report)
    throw new CliError("give --report FILE|URL (the provider's charges export)", EXIT.usage);
  const config = await readConfig(values.config);
  const { from, to } = windowOf(values.from, values.to);
  const autoUpTo = values["auto-refund-up-to"];
  if (autoUpTo !== undefined && !(Number(autoUpTo) >= 0)) {
    throw new CliError("--auto-refund-up-to takes an amount in minor units (e.g. 500 for 5.00)", EXIT.usage);
  }
  const autoRefund =
    autoUpTo !== undefined
      ? { maxAmount: Number(autoUpTo), kinds: config.autoRefund?.kinds }
      : config.autoRefund;
  if (autoRefund && !values["refund-url"]) {
    throw new CliError("refunds need --refund-url URL (the provider's API)", EXIT.usage);
  }
  const margin = 600_000;
  const text = await readReport(
    values.report,
    new Date(from.getTime() - margin),
    new Date(to.getTime() + margin),
  );
  let charges: ReturnType<typeof parseReport>;
  try {
    charges = parseReport(text, config.report);
  } catch (err) {
    throw new CliError(`${values.report}: ${(err as Error).message}`);
  }

  const { db, where, store } = await openStore({
    url: values["database-url"] ?? process.env.DATABASE_URL,
    schema: values.schema,
    retentionMs: retentionMs(undefined),
  });
  const extra: Db[] = [];
  try {
    for (const url of values["records-database-url"] ?? []) extra.push((await openDb(url)).db);
    const sources = (extra.length ? extra : [db]).map((d) => recordsFromSql(d, config.records));
    const records = async (w: { from: Date; to: Date }): Promise<ServiceRecord[]> =>
      (await Promise.all(sources.map((s) => s(w)))).flat();
    let report: ReconcileReport;
    try {
      report = await reconcile({
        store,
        charges,
        records,
        from,
        to,
        marginMs: margin,
        refund: values["refund-url"]
          ? httpRefunder(values["refund-url"], { apiKey: process.env.IDEM_PROVIDER_API_KEY })
          : undefined,
        autoRefund,
        review: values.review ? true : config.review,
        by: values.by,
      });
    } catch (err) {
      if (isReconcileError(err)) throw new CliError(err.message);
      throw err;
    }
    const open = report.findings.filter((f) => f.state !== "refunded" && f.state !== "settled");
    if (values.json) printJson({ database: where, ...report });
    else printReport(report, where);
    return open.length === 0 && report.errors.length === 0 ? EXIT.ok : EXIT.failure;
  } finally {
    for (const d of extra) await d.close().catch(() => {});
    await db.close();
  }
}

async function readConfig(file: string): Promise<Config> {
  let value: Partial<Config>;
  try {
    value = JSON.parse(await readFile(file, "utf8"));
  } catch (err) {
    throw new CliError(`cannot read --config ${file}: ${(err as Error).message}`, EXIT.usage);
  }
  try {
    parseMapping(value.report);
  } catch (err) {
    throw new CliError(`${file}: ${(err as Error).message} (under "report")`, EXIT.usage);
  }
  if (typeof value.records !== "string" || !value.records.trim()) {
    throw new CliError(`${file}: "records" must be the SQL that reads the service's records`, EXIT.usage);
  }
  const kinds = Object.values(FindingKind) as string[];
  for (const k of value.autoRefund?.kinds ?? []) {
    if (!kinds.includes(k))
      throw new CliError(`${file}: autoRefund.kinds: "${k}" is not one of ${kinds.join(", ")}`, EXIT.usage);
  }
  return value as Config;
}

function windowOf(fromFlag: string | undefined, toFlag: string | undefined): { from: Date; to: Date } {
  const time = (flag: string, v: string) => {
    const d = new Date(v);
    if (Number.isNaN(d.getTime()))
      throw new CliError(`--${flag} takes an ISO 8601 time, got "${v}"`, EXIT.usage);
    return d;
  };
  const today = new Date();
  today.setUTCHours(0, 0, 0, 0);
  const to = toFlag ? time("to", toFlag) : today;
  const from = fromFlag ? time("from", fromFlag) : new Date(to.getTime() - 86_400_000);
  if (!(from.getTime() < to.getTime())) throw new CliError("--from must be before --to", EXIT.usage);
  return { from, to };
}

async function readReport(source: string, from: Date, to: Date): Promise<string> {
  if (!/^https?:\/\//.test(source)) {
    try {
      return await readFile(source, "utf8");
    } catch (err) {
      throw new CliError(`cannot read --report ${source}: ${(err as Error).message}`, EXIT.usage);
    }
  }
  const url = source
    .replaceAll("{from}", encodeURIComponent(from.toISOString()))
    .replaceAll("{to}", encodeURIComponent(to.toISOString()));
  const headers: Record<string, string> = {};
  if (process.env.IDEM_PROVIDER_API_KEY)
    headers.authorization = `Bearer ${process.env.IDEM_PROVIDER_API_KEY}`;
  let res: Response;
  try {
    res = await fetch(url, { headers, signal: AbortSignal.timeout(60_000) });
  } catch (err) {
    throw new CliError(`the report at ${source} could not be fetched: ${(err as Error).message}`);
  }
  if (!res.ok) throw new CliError(`the report at ${source} answered HTTP ${res.status}`);
  return res.text();
}

function printReport(r: ReconcileReport, where: string): void {
  console.log(
    `${r.from.toISOString()} .. ${r.to.toISOString()}: ${r.charges} charge(s), ${r.records} record(s) on ${where}`,
  );
  for (const f of r.findings) {
    const money = `${f.amount} ${f.currency}`;
    console.log(printable(`${f.state.padEnd(9)} ${f.kind.padEnd(15)} ${money.padStart(12)}  ${f.detail}`));
  }
  for (const e of r.errors) console.log(printable(`error     ${e.finding}: ${e.message}`));
  console.log(
    `${r.findings.length} finding(s), ${r.newFindings} new; ${r.refunded.length} refunded, ${r.inReview.length} waiting for a person`,
  );
}
