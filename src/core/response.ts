/** A response as idem saves and replays it: status, allow-listed headers, body bytes. */
export interface StoredResponse {
  /** The HTTP status code. */
  status: number;
  /** Header name (lower case) and value pairs, in the order they were sent. */
  headers: Array<[string, string]>;
  /** The body's bytes, as sent (empty for none). */
  body: Uint8Array;
}

/** Headers replayed by default. Anything else the first response carried is dropped from the replay. */
export const DEFAULT_REPLAYED_HEADERS: readonly string[] = [
  "content-type",
  "content-language",
  "content-location",
  "content-disposition",
  "location",
  "etag",
  "last-modified",
  "cache-control",
  "link",
];

/** Never replayed, whatever the allow-list says: a replay must not hand out the first caller's session. */
const NEVER_REPLAYED = new Set(["set-cookie", "set-cookie2"]);

/** Keep only allow-listed headers (case-insensitive), never Set-Cookie. */
export function filterHeaders(
  headers: Iterable<[string, string]>,
  allow: readonly string[] = DEFAULT_REPLAYED_HEADERS,
): Array<[string, string]> {
  const allowed = new Set(allow.map((h) => h.toLowerCase()));
  const out: Array<[string, string]> = [];
  for (const [name, value] of headers) {
    const n = name.toLowerCase();
    if (allowed.has(n) && !NEVER_REPLAYED.has(n)) out.push([n, value]);
  }
  return out;
}

/** Which outcomes are saved and replayed. */
export interface SavePolicy {
  /**
   * Non-2xx statuses that are final business answers and are saved like a success (e.g. 402 declined).
   * Default: `[402]`.
   */
  saveStatuses?: readonly number[];
  /**
   * Save 5xx answers too, the way Stripe saves any result once execution began. Default: `false`
   * (a 5xx rolls back and the same key can be retried).
   */
  saveServerErrors?: boolean;
}

/** True when a response with this status is a final answer that must be saved. */
export function isSaved(status: number, policy: SavePolicy = {}): boolean {
  if (status >= 200 && status < 300) return true;
  if ((policy.saveStatuses ?? [402]).includes(status)) return true;
  if (status >= 500 && policy.saveServerErrors) return true;
  return false;
}

/** A saved answer that cannot be sent as it is (a row altered by hand or by a bug): never replayed. */
export class DamagedReplyError extends Error {
  /** Always `"DamagedReplyError"`: the name logs and stack traces show. */
  override name = "DamagedReplyError";
}

// RFC 9110 token; a value as Node and fetch's Headers accept it (no CR, LF or NUL).
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
const HEADER_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;

/** A saved answer as read from its row, checked before it is replayed: `DamagedReplyError` otherwise. */
export function checkedReply(status: unknown, headers: unknown, body: Uint8Array): StoredResponse {
  if (typeof status !== "number" || !Number.isInteger(status) || status < 200 || status > 599) {
    throw new DamagedReplyError(`the saved status ${String(status)} is not an HTTP status from 200 to 599`);
  }
  const list = headers ?? [];
  if (!Array.isArray(list))
    throw new DamagedReplyError("the saved headers are not a list of [name, value] pairs");
  for (const pair of list) {
    const ok =
      Array.isArray(pair) &&
      pair.length === 2 &&
      typeof pair[0] === "string" &&
      typeof pair[1] === "string" &&
      HEADER_NAME.test(pair[0]) &&
      HEADER_VALUE.test(pair[1]);
    if (!ok) throw new DamagedReplyError("a saved header is not a valid [name, value] pair");
  }
  return { status, headers: list as Array<[string, string]>, body };
}
