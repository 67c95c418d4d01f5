/**
 * What a reconciliation run costs in the process: reading a day's charges report (CSV through
 * csv-parse, in major units; the same charges as JSON as the yardstick) and joining it with the records
 * (`compare`), for 100,000 charges with a few hundred differences of each kind. No database: the
 * recording and the actions are a few statements per finding, not per charge.
 *
 *   npx tsx --conditions=source bench/reconcile.ts
 *
 * Printed: wall µs and CPU µs per charge for each step, best of three rounds, and the CSV/JSON ratio
 * measured in the same run.
 */
import { cpuUsage } from "node:process";
import { compare, parseMapping, parseReport, type ServiceRecord } from "../src/reconcile/index.ts";
import { reportCsv, reportLines } from "../src/testing/provider-report.ts";

const N = Number(process.env.RECONCILE_CHARGES ?? 100_000);
const day = Date.parse("2026-12-01T00:00:00Z");
const charges = Array.from({ length: N }, (_, i) => ({
  id: `ch_${i.toString(16).padStart(24, "0")}`,
  amount: 500 + (i % 9_000),
  currency: "eur",
  status: (i % 97 === 0 ? "failed" : "succeeded") as "succeeded" | "failed",
  reference: `acct_${i % 5_000}:0190c5a4-0000-7000-8000-${i.toString(16).padStart(12, "0")}`,
  idempotency_key: null,
  created: new Date(day + Math.floor((i * 86_400_000) / N)).toISOString(),
}));
// The records: every succeeded charge but 1 in 500 (orphans), an amount off for 1 in 700, and 1 in 900
// extra records the provider never charged (missing).
const records: ServiceRecord[] = [];
charges.forEach((c, i) => {
  if (c.status !== "succeeded" || i % 500 === 1) return;
  records.push({
    reference: c.reference,
    amount: i % 700 === 2 ? c.amount + 1 : c.amount,
    currency: "eur",
    at: new Date(c.created),
  });
  if (i % 900 === 3)
    records.push({ reference: `${c.reference}x`, amount: 100, currency: "eur", at: new Date(c.created) });
});
const lines = reportLines({ charges: () => charges, refundedOf: () => 0, send: () => {} });
const csv = reportCsv(lines);
const json = JSON.stringify({ data: lines });
const columns = { reference: "reference", currency: "currency", id: "id", status: "status" };
const csvMapping = parseMapping({
  format: "csv",
  amountUnit: "major",
  columns: { ...columns, amount: "gross", time: "created_utc", refunded: "amount_refunded" },
});
const jsonMapping = parseMapping({
  format: "json",
  columns: { ...columns, amount: "amount", time: "created", refunded: "amount_refunded" },
});

function measure<T>(fn: () => T): { wallUs: number; cpuUs: number; value: T } {
  let best = { wallUs: Number.POSITIVE_INFINITY, cpuUs: Number.POSITIVE_INFINITY, value: undefined as T };
  for (let round = 0; round < 3; round++) {
    const c0 = cpuUsage();
    const t0 = performance.now();
    const value = fn();
    const wallUs = ((performance.now() - t0) * 1000) / N;
    const c = cpuUsage(c0);
    const cpuUs = (c.user + c.system) / N;
    if (wallUs < best.wallUs) best = { wallUs, cpuUs, value };
  }
  return best;
}

const fromCsv = measure(() => parseReport(csv, csvMapping));
const fromJson = measure(() => parseReport(json, jsonMapping));
const window = { from: new Date(day), to: new Date(day + 86_400_000) };
const joined = measure(() => compare(fromCsv.value, records, window));
const kinds: Record<string, number> = {};
for (const f of joined.value) kinds[f.kind] = (kinds[f.kind] ?? 0) + 1;

const row = (name: string, m: { wallUs: number; cpuUs: number }) =>
  console.log(
    `${name.padEnd(34)} ${m.wallUs.toFixed(2).padStart(7)} µs/charge  ${m.cpuUs.toFixed(2).padStart(7)} µs CPU/charge`,
  );
console.log(`reconcile: ${N} charges (${(csv.length / 1e6).toFixed(1)} MB CSV), ${records.length} records`);
row("read the CSV report (csv-parse)", fromCsv);
row("read the JSON report (yardstick)", fromJson);
row("compare (join, four kinds)", joined);
console.log(
  `CSV / JSON: ${(fromCsv.wallUs / fromJson.wallUs).toFixed(2)}x wall, ${(fromCsv.cpuUs / fromJson.cpuUs).toFixed(2)}x CPU; ` +
    `a whole run (CSV + compare): ${(((fromCsv.wallUs + joined.wallUs) * N) / 1e6).toFixed(2)} s for ${N} charges`,
);
console.log(`findings: ${JSON.stringify(kinds)}`);
