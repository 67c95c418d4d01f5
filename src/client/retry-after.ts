/**
 * `Retry-After` (RFC 9110 section 10.2.3): either a whole number of seconds or an HTTP date. The
 * server knows when it will have room, so its hint replaces the computed backoff.
 */

const SECONDS = /^\s*(\d+(?:\.\d+)?)\s*$/;

/**
 * The wait the header asks for, in milliseconds (never negative), or `undefined` when the header is
 * absent or unreadable. Decimal seconds are accepted although the RFC only allows whole ones.
 * A date in the past means "now" (0).
 */
export function parseRetryAfter(
  value: string | null | undefined,
  now: number = Date.now(),
): number | undefined {
  // Stryker disable next-line all: equivalent (a shortcut): null and "" fail both patterns below and end as undefined
  if (value == null || value === "") return undefined;
  const seconds = SECONDS.exec(value);
  if (seconds) return Number(seconds[1]) * 1000;
  // Only dates that look like dates: Date.parse accepts bare numbers such as "-1" or "12".
  if (!/[a-z]/i.test(value)) return undefined;
  const at = Date.parse(value);
  if (Number.isNaN(at)) return undefined;
  return Math.max(0, at - now);
}

/** The hint carried by a response, in milliseconds, if any. */
export function retryAfterFrom(response: Response, now: number = Date.now()): number | undefined {
  return parseRetryAfter(response.headers.get("retry-after"), now);
}
