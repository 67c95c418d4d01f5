/**
 * An `authorize` hook for the admin API: bearer tokens, one per person, compared in constant time (both
 * sides hashed with SHA-256 first, so neither the content nor the length of a token leaks through
 * timing). Only Fetch API globals: runs on Node, Bun, Deno and edge runtimes.
 *
 * Every token must carry at least 128 bits, in every form it is given in (a bare token, `name:token`
 * pairs, or `bearerTokens` called directly): what its length is worth in the alphabet it is written in
 * (4 bits a character for hex digits, 6 for base64 and base64url, 6.5 for other printable ASCII), with
 * enough different characters to be random. `openssl rand -base64 24` makes one.
 */
import type { Authorize } from "./handler.ts";

/** The least a token must carry, in bits. */
export const MIN_ADMIN_TOKEN_BITS = 128;
/** How to make a token that is strong enough, for error messages. */
const MAKE_ONE = "make one with `openssl rand -base64 24`";

/** A token's strength as its alphabet and length say (an upper bound: a person's word scores high too). */
export function tokenBits(token: string): number {
  const perChar = /^[0-9a-fA-F]+$/.test(token)
    ? 4
    : /^[A-Za-z0-9+/=_-]+$/.test(token)
      ? 6
      : /^[\x21-\x7e]+$/.test(token)
        ? 6.5
        : 0;
  return token.length * perChar;
}

/** Why `token` is not strong enough, or undefined when it is. */
function weakness(token: string): string | undefined {
  if (!/^[\x21-\x7e]+$/.test(token)) return "it must be printable ASCII without spaces";
  const bits = tokenBits(token);
  if (bits < MIN_ADMIN_TOKEN_BITS) {
    return `it carries about ${Math.floor(bits)} bits, at least ${MIN_ADMIN_TOKEN_BITS} are needed (${MAKE_ONE})`;
  }
  if (new Set(token).size < 10) return `it repeats too few characters to be random (${MAKE_ONE})`;
  return undefined;
}

/** An admin token setting that cannot be used: the message names the setting and says how to fix it. */
export class AdminTokenError extends Error {
  /** Always `"AdminTokenError"`: the name logs and stack traces show. */
  override name = "AdminTokenError";
}

/**
 * Parse `IDEM_ADMIN_TOKEN`-style settings: `name:token,name:token`, or one bare token (its holder is
 * recorded as `admin`). Empty or unset: no tokens (the admin API is off). A token weaker than 128 bits,
 * or a malformed entry, is an `AdminTokenError` naming `setting` (default `IDEM_ADMIN_TOKEN`).
 */
export function parseAdminTokens(
  value: string | undefined,
  setting = "IDEM_ADMIN_TOKEN",
): Array<{ name: string; token: string }> {
  const entries = (value ?? "")
    .split(",")
    .map((e) => e.trim())
    .filter(Boolean);
  const tokens =
    entries.length === 1 && !entries[0]!.includes(":")
      ? [{ name: "admin", token: entries[0]! }]
      : entries.map((e) => {
          const at = e.indexOf(":");
          const name = e.slice(0, at).trim();
          if (at <= 0 || !name) {
            throw new AdminTokenError(
              `${setting}: admin tokens take the form name:token (one per person), comma-separated`,
            );
          }
          return { name, token: e.slice(at + 1).trim() };
        });
  for (const t of tokens) {
    const why = weakness(t.token);
    if (why) throw new AdminTokenError(`${setting}: the admin token of "${t.name}" is too weak: ${why}`);
  }
  return tokens;
}

const digest = async (s: string) =>
  new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(s)));

/**
 * `authorize` that accepts `Authorization: Bearer <token>` for any of `tokens`, naming its holder. A
 * token weaker than 128 bits is refused here too (`AdminTokenError`), however it was given.
 */
export function bearerTokens(tokens: Array<{ name: string; token: string }>): Authorize {
  for (const t of tokens) {
    const why = weakness(t.token);
    if (why) throw new AdminTokenError(`the admin token of "${t.name}" is too weak: ${why}`);
  }
  const hashed = Promise.all(tokens.map(async (t) => ({ name: t.name, hash: await digest(t.token) })));
  return async (request) => {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(request.headers.get("authorization") ?? "");
    if (!m) return null;
    const given = await digest(m[1]!);
    let who: string | null = null;
    for (const t of await hashed) {
      let diff = 0;
      for (let i = 0; i < given.length; i++) diff |= given[i]! ^ t.hash[i]!;
      if (diff === 0 && who === null) who = t.name; // no early exit: every token is compared
    }
    return who;
  };
}
