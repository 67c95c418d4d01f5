/**
 * An `authorize` hook for the admin API: bearer tokens, one per person, compared in constant time (both
 * sides hashed with SHA-256 first, so neither the content nor the length of a token leaks through
 * timing). Only Fetch API globals: runs on Node, Bun, Deno and edge runtimes.
 */
import type { Authorize } from "./handler.ts";

/**
 * Parse `IDEM_ADMIN_TOKEN`-style settings: `name:token,name:token`, or one bare token (its holder is
 * recorded as `admin`). Empty or unset: no tokens (the admin API is off).
 */
export function parseAdminTokens(setting: string | undefined): Array<{ name: string; token: string }> {
  const entries = (setting ?? "")
    .split(",")
    .map((e) => e.trim())
    .filter(Boolean);
  if (entries.length === 1 && !entries[0]!.includes(":")) return [{ name: "admin", token: entries[0]! }];
  return entries.map((e) => {
    const at = e.indexOf(":");
    const name = e.slice(0, at).trim();
    const token = e.slice(at + 1).trim();
    if (at <= 0 || !name || token.length < 16) {
      throw new Error(
        "admin tokens take the form name:token (tokens of 16 characters or more), comma-separated",
      );
    }
    return { name, token };
  });
}

const digest = async (s: string) =>
  new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(s)));

/** `authorize` that accepts `Authorization: Bearer <token>` for any of `tokens`, naming its holder. */
export function bearerTokens(tokens: Array<{ name: string; token: string }>): Authorize {
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
