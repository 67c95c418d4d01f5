/**
 * The provider's charges report, read through a small declarative mapping: which column (CSV header, or
 * JSON field, dotted for nested ones) is the reference, the amount, the currency and the time. Every
 * provider names its export's columns its own way; the mapping is the only thing that changes.
 *
 *   { "format": "csv", "amountUnit": "major",
 *     "columns": { "reference": "reference", "amount": "gross", "currency": "currency",
 *                  "time": "created_utc", "id": "id", "status": "status", "refunded": "amount_refunded" } }
 *
 * CSV is read with csv-parse (quoted fields, embedded commas and newlines, a BOM, CRLF): a report is
 * data from another system, and a hand-written splitter gets exactly those cases wrong.
 */
import { parse } from "csv-parse/sync";
import { toMinor } from "./currency.ts";
import { ReconcileError, ReconcileErrorCode } from "./errors.ts";

/** Which column of the report is what. */
export interface ReportColumns {
  /** Our downstream idempotency reference (the charge's metadata, or its idempotency key). Required. */
  reference: string;
  /** The amount charged. Required. */
  amount: string;
  /** ISO 4217 currency. Required. */
  currency: string;
  /** When the charge was made (ISO 8601, or seconds since the epoch). Required. */
  time: string;
  /** The provider's charge id (what a refund names). Default: none (findings cannot be refunded). */
  id?: string;
  /** The charge's status (see `ReportMapping.succeeded`). Default: none (every line took money). */
  status?: string;
  /** How much of it was refunded already, in the same unit as `amount`. Default: none (0). */
  refunded?: string;
}

/** How to read one provider's report. */
export interface ReportMapping {
  /** `csv` or `json`. Default: `json` when the text starts with `{` or `[`, else `csv`. */
  format?: "csv" | "json";
  /** Which column is what. Required. */
  columns: ReportColumns;
  /** `minor` (5000) or `major` (50.00, scaled by the currency's digits). Default `minor`. */
  amountUnit?: "minor" | "major";
  /** Status values of charges that took money. Default `succeeded`, `paid`, `captured` (case-insensitive). */
  succeeded?: string[];
  /** JSON: the dotted path of the list of charges. Default: the document if it is a list, else its `data`. */
  rows?: string;
  /** CSV: the field delimiter. Default `,`. */
  delimiter?: string;
}

/** One charge of the report, in the reconciliation's terms. */
export interface ProviderCharge {
  /** The provider's charge id; null when the mapping has no `id`. */
  id: string | null;
  /** Our reference; "" when the charge has none (made outside our service). */
  reference: string;
  /** Charged, in minor units. */
  amount: number;
  /** Refunded so far, in minor units. */
  refunded: number;
  /** Lower-case currency. */
  currency: string;
  /** When it was made. */
  at: Date;
  /** Whether it took money (by `succeeded`). */
  succeeded: boolean;
  /** Its line in the report (1 is the first charge), for messages. */
  line: number;
}

const DEFAULT_SUCCEEDED = ["succeeded", "paid", "captured"];
const REQUIRED = ["reference", "amount", "currency", "time"] as const;

/** Check a mapping read from a file (JSON), with a message naming what is wrong. */
export function parseMapping(value: unknown): ReportMapping {
  const bad = (why: string) => new ReconcileError(ReconcileErrorCode.badMapping, `the report mapping ${why}`);
  if (typeof value !== "object" || value === null) throw bad("is not an object");
  const m = value as Partial<ReportMapping>;
  if (typeof m.columns !== "object" || m.columns === null) throw bad('has no "columns" object');
  for (const name of REQUIRED) {
    if (typeof m.columns[name] !== "string" || !m.columns[name]) {
      throw bad(`has no column for "${name}" (columns.${name}: the report's column name)`);
    }
  }
  for (const name of ["id", "status", "refunded"] as const) {
    const v = m.columns[name];
    if (v !== undefined && (typeof v !== "string" || !v)) throw bad(`columns.${name} is not a column name`);
  }
  if (m.format !== undefined && m.format !== "csv" && m.format !== "json") {
    throw bad(`format is ${JSON.stringify(m.format)}, not "csv" or "json"`);
  }
  if (m.amountUnit !== undefined && m.amountUnit !== "minor" && m.amountUnit !== "major") {
    throw bad(`amountUnit is ${JSON.stringify(m.amountUnit)}, not "minor" or "major"`);
  }
  if (
    m.succeeded !== undefined &&
    !(Array.isArray(m.succeeded) && m.succeeded.every((s) => typeof s === "string"))
  ) {
    throw bad("succeeded is not a list of status values");
  }
  return m as ReportMapping;
}

/** Read a report's text with `mapping`. Throws `ReconcileError` (bad-report) naming the line and column. */
export function parseReport(text: string, mapping: ReportMapping): ProviderCharge[] {
  const format = mapping.format ?? (/^\s*[[{]/.test(text) ? "json" : "csv");
  const rows = format === "json" ? jsonRows(text, mapping.rows) : csvRows(text, mapping.delimiter);
  const succeeded = new Set((mapping.succeeded ?? DEFAULT_SUCCEEDED).map((s) => s.toLowerCase()));
  const c = mapping.columns;
  return rows.map((row, i) => {
    const line = i + 1;
    const bad = (why: string) =>
      new ReconcileError(ReconcileErrorCode.badReport, `the report's charge ${line}: ${why}`);
    const field = (column: string, required: boolean): string | undefined => {
      const v = pick(row, column);
      if (v === undefined || v === null || v === "") {
        if (required) throw bad(`no value in column "${column}"`);
        return undefined;
      }
      return String(v);
    };
    const currency = field(c.currency, true)!.toLowerCase();
    const amountOf = (column: string, required: boolean): number => {
      const raw = field(column, required);
      if (raw === undefined) return 0;
      const n = mapping.amountUnit === "major" ? toMinor(raw, currency) : Number(raw);
      if (!Number.isFinite(n) || (mapping.amountUnit !== "major" && !Number.isInteger(n))) {
        throw bad(
          `"${raw}" in column "${column}" is not an amount in ${mapping.amountUnit ?? "minor"} units`,
        );
      }
      return n;
    };
    const rawTime = field(c.time, true)!;
    const at = /^\d+(\.\d+)?$/.test(rawTime) ? new Date(Number(rawTime) * 1000) : new Date(rawTime);
    if (Number.isNaN(at.getTime())) throw bad(`"${rawTime}" in column "${c.time}" is not a time`);
    const status = c.status ? field(c.status, false) : undefined;
    return {
      id: c.id ? (field(c.id, false) ?? null) : null,
      reference: field(c.reference, false) ?? "",
      amount: amountOf(c.amount, true),
      refunded: c.refunded ? amountOf(c.refunded, false) : 0,
      currency,
      at,
      succeeded: status === undefined ? !c.status : succeeded.has(status.toLowerCase()),
      line,
    };
  });
}

function csvRows(text: string, delimiter = ","): Record<string, unknown>[] {
  try {
    return parse(text, { columns: true, bom: true, skip_empty_lines: true, trim: true, delimiter });
  } catch (err) {
    throw new ReconcileError(
      ReconcileErrorCode.badReport,
      `the report is not valid CSV: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  }
}

function jsonRows(text: string, path: string | undefined): Record<string, unknown>[] {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new ReconcileError(
      ReconcileErrorCode.badReport,
      `the report is not valid JSON: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  }
  const list = path ? pick(doc, path) : Array.isArray(doc) ? doc : pick(doc, "data");
  if (!Array.isArray(list)) {
    throw new ReconcileError(
      ReconcileErrorCode.badReport,
      `the JSON report has no list of charges at ${path ? `"${path}"` : "its top level or under data"}`,
    );
  }
  return list as Record<string, unknown>[];
}

/** `row[a][b]` for "a.b" (a CSV column whose name has a dot is found by its whole name first). */
function pick(row: unknown, path: string): unknown {
  if (typeof row !== "object" || row === null) return undefined;
  if (path in row) return (row as Record<string, unknown>)[path];
  let v: unknown = row;
  for (const part of path.split(".")) {
    if (typeof v !== "object" || v === null) return undefined;
    v = (v as Record<string, unknown>)[part];
  }
  return v;
}
