/**
 * What validating a request from its schema costs (app/schemas.ts, compiled by Ajv in app/validate.ts),
 * against the hand-written checks it replaced (copied below as they were, as the baseline). Both parse
 * the same bodies (JSON and form, valid and invalid) in one run; printed as µs per request and a ratio.
 *
 *   npx tsx --conditions=source bench/schema.ts        (no database needed)
 */
import { bodyKind } from "idem";
import { PaymentRequest } from "../app/schemas.ts";
import { parseBody } from "../app/validate.ts";

const MAX_AMOUNT_CENTS = 100_000_000;

/** The hand-written validator of `POST /v1/payments` before the schemas (app/payments.ts, issue 12). */
function handWritten(contentType: string, raw: string): { amount_cents: number; currency: string } | string {
  let fields: Record<string, unknown>;
  const kind = bodyKind(contentType);
  if (kind === "json") {
    try {
      fields = JSON.parse(raw);
    } catch {
      return "the body is not valid JSON";
    }
    if (fields === null || typeof fields !== "object" || Array.isArray(fields))
      return "the body must be a JSON object";
  } else if (kind === "form") {
    const f = Object.fromEntries(new URLSearchParams(raw));
    fields = { ...f };
    if (typeof f.amount_cents === "string" && /^\d{1,15}$/.test(f.amount_cents)) {
      fields.amount_cents = Number(f.amount_cents);
    }
  } else {
    return "send the body as application/json or application/x-www-form-urlencoded";
  }
  const amount = fields.amount_cents;
  if (typeof amount !== "number" || !Number.isInteger(amount) || amount <= 0 || amount > MAX_AMOUNT_CENTS) {
    return `amount_cents must be a whole number from 1 to ${MAX_AMOUNT_CENTS}`;
  }
  const currency = fields.currency;
  if (typeof currency !== "string" || !/^[a-z]{3}$/.test(currency)) {
    return 'currency must be a three-letter lower-case ISO 4217 code such as "eur"';
  }
  return { amount_cents: amount, currency };
}

const JSON_CT = "application/json";
const FORM_CT = "application/x-www-form-urlencoded";
const CASES: Array<[string, string, string]> = [
  ["valid JSON", JSON_CT, '{"amount_cents":1500,"currency":"eur"}'],
  ["valid form", FORM_CT, "amount_cents=1500&currency=eur"],
  ["invalid JSON (bad currency)", JSON_CT, '{"amount_cents":1500,"currency":"EURO"}'],
  ["invalid JSON (no amount)", JSON_CT, '{"currency":"eur"}'],
];

function usPerCall(fn: () => unknown, iterations: number): number {
  for (let i = 0; i < 20_000; i++) fn(); // warm up (JIT)
  const t0 = performance.now();
  for (let i = 0; i < iterations; i++) fn();
  return ((performance.now() - t0) * 1000) / iterations;
}

export interface SchemaBenchRow {
  case: string;
  handWrittenUs: number;
  schemaUs: number;
  ratio: number;
}

export function schemaBench(iterations = 300_000): SchemaBenchRow[] {
  return CASES.map(([name, ct, body]) => {
    // The same answer from both, or the comparison means nothing.
    const a = handWritten(ct, body);
    const b = parseBody(PaymentRequest, ct, body);
    if ((typeof a === "string") === b.ok) throw new Error(`${name}: the two validators disagree`);
    // Interleaved, best of three each: the machine is shared.
    let hw = Number.POSITIVE_INFINITY;
    let sc = Number.POSITIVE_INFINITY;
    for (let round = 0; round < 3; round++) {
      hw = Math.min(
        hw,
        usPerCall(() => handWritten(ct, body), iterations),
      );
      sc = Math.min(
        sc,
        usPerCall(() => parseBody(PaymentRequest, ct, body), iterations),
      );
    }
    return { case: name, handWrittenUs: hw, schemaUs: sc, ratio: sc / hw };
  });
}

export function printSchemaBench(rows: SchemaBenchRow[]): void {
  console.log("POST /v1/payments body validation, µs per request (parse + check, best of 3 rounds):");
  console.log("  case                          hand-written   schema (Ajv)   schema / hand-written");
  for (const r of rows) {
    console.log(
      `  ${r.case.padEnd(30)}${r.handWrittenUs.toFixed(3).padStart(12)}${r.schemaUs.toFixed(3).padStart(15)}${`${r.ratio.toFixed(2)}x`.padStart(24)}`,
    );
  }
}

if (import.meta.url === `file://${process.argv[1]}`) printSchemaBench(schemaBench());
