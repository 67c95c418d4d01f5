/** Reading a provider's report through a mapping: CSV as another system writes it, JSON, and bad input. */
import { describe, expect, it } from "vitest";
import { compare, isReconcileError, parseMapping, parseReport } from "../../src/reconcile/index.ts";

const mapping = parseMapping({
  amountUnit: "major",
  columns: {
    reference: "meta.ref",
    amount: "Gross",
    currency: "Cur",
    time: "When",
    id: "Id",
    status: "State",
  },
});

describe("the charges report through a mapping", () => {
  it("reads quoted fields, embedded commas and newlines, a BOM and CRLF; amounts by the currency's digits", () => {
    const csv =
      "\uFEFFId,When,Gross,Cur,State,meta.ref\r\n" +
      'ch_1,2026-12-01T10:00:00Z,50.00,EUR,succeeded,"acct,1:k"\r\n' +
      'ch_2,1764583200,5000,jpy,Succeeded,"multi\nline"\r\n' +
      "ch_3,2026-12-01T11:00:00Z,1.5,eur,failed,\r\n";
    const charges = parseReport(csv, mapping);
    expect(charges.map((c) => [c.id, c.reference, c.amount, c.currency, c.succeeded])).toEqual([
      ["ch_1", "acct,1:k", 5000, "eur", true],
      ["ch_2", "multi\nline", 5000, "jpy", true],
      ["ch_3", "", 150, "eur", false],
    ]);
    expect(charges[1]!.at.toISOString()).toBe("2025-12-01T10:00:00.000Z");
  });

  it("reads JSON at a dotted path, in minor units", () => {
    const m = parseMapping({
      rows: "result.items",
      columns: { reference: "metadata.ref", amount: "amount", currency: "currency", time: "created" },
    });
    const [c] = parseReport(
      JSON.stringify({
        result: {
          items: [
            { amount: 700, currency: "eur", created: "2026-12-01T00:00:00Z", metadata: { ref: "a:b" } },
          ],
        },
      }),
      m,
    );
    expect(c).toMatchObject({ reference: "a:b", amount: 700, succeeded: true, id: null });
  });

  it("says which column or line is wrong, with a stable code", () => {
    expect(() => parseMapping({ columns: { reference: "r", amount: "a", currency: "c" } })).toThrow(
      /no column for "time"/,
    );
    let err: unknown;
    try {
      parseReport("Id,When,Gross,Cur,State,meta.ref\nch_1,yesterday,50.00,eur,succeeded,x\n", mapping);
    } catch (e) {
      err = e;
    }
    expect(isReconcileError(err)).toBe(true);
    expect(String((err as Error).message)).toBe(
      `the report's charge 1: "yesterday" in column "When" is not a time`,
    );
    expect(() => parseReport('Id,When\n"unterminated,1\n', mapping)).toThrow(/not valid CSV/);
  });

  it("joins at the window's edge: a charge just before it meets its record just inside", () => {
    const at = (iso: string) => new Date(iso);
    const found = compare(
      [
        {
          id: "ch_e",
          reference: "s:r",
          amount: 100,
          refunded: 0,
          currency: "eur",
          at: at("2026-12-01T23:59:59Z"),
          succeeded: true,
          line: 1,
        },
      ],
      [{ reference: "s:r", amount: 100, currency: "eur", at: at("2026-12-02T00:00:01Z") }],
      { from: at("2026-12-02T00:00:00Z"), to: at("2026-12-03T00:00:00Z") },
    );
    expect(found).toEqual([]);
  });
});
