/**
 * The provider simulator's charges report (provider.ts routes it here): what a real provider's daily
 * export gives the reconciliation job (`idem reconcile`), as CSV or JSON.
 *
 *   GET /v1/reports/charges?from=<ISO time>&to=<ISO time>&format=csv|json
 *       the charges made in [from, to) (default: every charge kept), oldest first
 *
 * The CSV is shaped like a provider's itemized export, not like idem's records (so a reconciliation
 * must map it): `id, created_utc, gross, currency, status, amount_refunded, reference, idempotency_key`,
 * with amounts in MAJOR units ("50.00"). The JSON is `{"data": [...]}` with amounts in minor units.
 */
import type { ServerResponse } from "node:http";
import { stringify } from "csv-stringify/sync";
import { toMajor as major } from "../reconcile/currency.ts";

/** What the report reads of a charge (provider.ts's `Charge`). */
export interface ChargeLike {
  id: string;
  amount: number;
  currency: string;
  status: "succeeded" | "failed";
  reference: string | null;
  idempotency_key: string | null;
  created: string;
}

/** One line of the report. */
export interface ReportLine {
  id: string;
  created: string;
  /** Minor units. */
  amount: number;
  currency: string;
  status: ChargeLike["status"];
  /** Minor units refunded so far. */
  amount_refunded: number;
  reference: string | null;
  idempotency_key: string | null;
}

/** What the report needs of the simulator around it. */
export interface ReportContext {
  charges: () => readonly ChargeLike[];
  refundedOf: (chargeId: string) => number;
  send: (res: ServerResponse, status: number, body: unknown, headers?: Record<string, string>) => void;
}

/** The charges report's lines for [from, to). */
export function reportLines(ctx: ReportContext, from?: Date, to?: Date): ReportLine[] {
  return ctx
    .charges()
    .filter((c) => {
      const at = Date.parse(c.created);
      return (!from || at >= from.getTime()) && (!to || at < to.getTime());
    })
    .map((c) => ({
      id: c.id,
      created: c.created,
      amount: c.amount,
      currency: c.currency,
      status: c.status,
      amount_refunded: ctx.refundedOf(c.id),
      reference: c.reference,
      idempotency_key: c.idempotency_key,
    }));
}

/** The report as CSV text (amounts in major units). */
export function reportCsv(lines: readonly ReportLine[]): string {
  return stringify(
    lines.map((l) => [
      l.id,
      l.created,
      major(l.amount, l.currency),
      l.currency,
      l.status,
      major(l.amount_refunded, l.currency),
      l.reference ?? "",
      l.idempotency_key ?? "",
    ]),
    {
      header: true,
      columns: [
        "id",
        "created_utc",
        "gross",
        "currency",
        "status",
        "amount_refunded",
        "reference",
        "idempotency_key",
      ],
    },
  );
}

/** Answer `GET /v1/reports/charges`; false for any other path. */
export function handleReport(ctx: ReportContext, res: ServerResponse, method: string, url: URL): boolean {
  if (method !== "GET" || url.pathname !== "/v1/reports/charges") return false;
  const time = (name: string): Date | undefined | null => {
    const v = url.searchParams.get(name);
    if (v === null) return undefined;
    const d = new Date(v);
    return Number.isNaN(d.getTime()) ? null : d;
  };
  const from = time("from");
  const to = time("to");
  if (from === null || to === null) {
    ctx.send(res, 400, {
      error: { type: "invalid_request_error", code: "invalid_time", message: "from, to: ISO 8601 times." },
    });
    return true;
  }
  const lines = reportLines(ctx, from, to);
  if ((url.searchParams.get("format") ?? "csv") === "json") {
    ctx.send(res, 200, { data: lines });
  } else {
    const text = reportCsv(lines);
    res.writeHead(200, {
      "content-type": "text/csv; charset=utf-8",
      "content-length": Buffer.byteLength(text),
    });
    res.end(text);
  }
  return true;
}
