import { KeyInvalidError } from "./errors.ts";

/** The key rule, in one place: 1..MAX_KEY_LENGTH visible ASCII characters (0x21-0x7E). */
export const MAX_KEY_LENGTH = 255;
/** The key's characters as a JSON Schema / ECMAScript pattern (OpenAPI documents and forms use it). */
export const IDEMPOTENCY_KEY_PATTERN = "^[\\x21-\\x7E]+$";
const KEY_CHARS = new RegExp(IDEMPOTENCY_KEY_PATTERN);

/**
 * Parse an `Idempotency-Key` header value.
 *
 * The IETF draft sends the key as an RFC 8941 sf-string (`"8e03978e-..."`, with `\"` and `\\` as the
 * only escapes); Stripe-style clients send a bare token. Both are accepted. RFC 8941 parameters after
 * the string (`"abc";v=1`) are ignored. The key itself must be 1..255 visible ASCII characters.
 *
 * Returns `undefined` when the header is absent; throws `KeyInvalidError` when it is malformed.
 */
export function parseIdempotencyKey(value: string | null | undefined): string | undefined {
  if (value === null || value === undefined) return undefined;
  const v = value.trim();
  if (v.length === 0) throw new KeyInvalidError("it is empty");
  const key = v.startsWith('"') ? parseSfString(v) : v;
  checkKey(key);
  return key;
}

function parseSfString(v: string): string {
  let out = "";
  let i = 1;
  for (; i < v.length; i++) {
    const ch = v.charCodeAt(i);
    if (ch === 0x5c /* \ */) {
      const next = v[i + 1];
      if (next !== '"' && next !== "\\") throw new KeyInvalidError('a quoted key may only escape " and \\');
      out += next;
      i++;
    } else if (ch === 0x22 /* " */) {
      break;
    } else {
      out += v[i];
    }
  }
  if (i >= v.length) throw new KeyInvalidError("the quoted key has no closing quote");
  const rest = v.slice(i + 1).trim();
  if (rest !== "" && !/^(;\s*[a-z*][a-z0-9_.*-]*(=[^;]*)?\s*)+$/.test(rest)) {
    throw new KeyInvalidError("unexpected characters after the quoted key");
  }
  return out;
}

function checkKey(key: string): void {
  if (key.length === 0) throw new KeyInvalidError("it is empty");
  if (key.length > MAX_KEY_LENGTH)
    throw new KeyInvalidError(`it is longer than ${MAX_KEY_LENGTH} characters`);
  if (!KEY_CHARS.test(key)) {
    throw new KeyInvalidError(
      "it may only contain visible ASCII characters (no spaces, no control characters)",
    );
  }
}

/** Whether `key` follows the key rule (1..255 visible ASCII characters): what may be looked up. */
export function isValidKey(key: string): boolean {
  return typeof key === "string" && key.length > 0 && key.length <= MAX_KEY_LENGTH && KEY_CHARS.test(key);
}

/** Format a key as the draft's sf-string, for clients that send it. */
export function formatIdempotencyKey(key: string): string {
  checkKey(key);
  return `"${key.replace(/[\\"]/g, (c) => `\\${c}`)}"`;
}
