/** Request headers as the client keeps them: a plain object with lower-cased names. */
export type HeaderMap = Record<string, string>;

/** Headers as a plain object with lower-cased names (cheaper for fetch than a Headers object). */
export function toHeaderMap(
  init: HeadersInit | readonly (readonly [string, string])[] | undefined,
): HeaderMap {
  const out: HeaderMap = {};
  if (init === undefined) return out;
  if (Array.isArray(init)) {
    for (const [name, value] of init as [string, string][]) {
      const k = name.toLowerCase();
      out[k] = k in out ? `${out[k]}, ${value}` : value;
    }
  } else if (typeof Headers !== "undefined" && init instanceof Headers) {
    init.forEach((value, name) => {
      out[name] = value;
    });
  } else {
    for (const name in init as Record<string, string>) {
      out[name.toLowerCase()] = String((init as Record<string, string>)[name]);
    }
  }
  return out;
}
