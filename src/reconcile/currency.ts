/** Minor units and major units of a currency (5000 and "50.00" for eur; 5000 and "5000" for jpy). */

/** The currency's minor-unit digits (2 for eur, 0 for jpy, 3 for kwd), as `Intl` knows them. */
export function currencyDigits(currency: string): number {
  try {
    const digits = new Intl.NumberFormat("en", { style: "currency", currency }).resolvedOptions()
      .maximumFractionDigits;
    return digits ?? 2;
  } catch {
    return 2; // not an ISO 4217 code Intl knows
  }
}

/** An amount in minor units written in major units: 5000 eur -> "50.00". */
export function toMajor(minor: number, currency: string): string {
  const digits = currencyDigits(currency);
  return (minor / 10 ** digits).toFixed(digits);
}

/** A major-unit amount ("50.00", "1,234.5" is refused) in minor units, or NaN when it is not a number. */
export function toMinor(major: string, currency: string): number {
  const text = major.trim();
  if (!/^-?\d+(\.\d+)?$/.test(text)) return Number.NaN;
  return Math.round(Number(text) * 10 ** currencyDigits(currency));
}
