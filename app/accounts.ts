import { createHash, randomBytes } from "node:crypto";
import type { Db } from "idem/postgres";

export const DEMO_ACCOUNTS = [
  { id: "acct_demo_1", name: "Demo account 1", apiKey: "sk_test_demo_1" },
  { id: "acct_demo_2", name: "Demo account 2", apiKey: "sk_test_demo_2" },
] as const;

export function hashApiKey(apiKey: string): Buffer {
  return createHash("sha256").update(apiKey).digest();
}

/** Create an account and return its new API key (shown once; only its hash is stored). */
export async function createAccount(db: Db, name: string): Promise<{ id: string; apiKey: string }> {
  const id = `acct_${randomBytes(8).toString("hex")}`;
  const apiKey = `sk_live_${randomBytes(24).toString("base64url")}`;
  await db.transaction(async (tx) => {
    await tx.query("INSERT INTO accounts (id, name) VALUES ($1, $2)", [id, name]);
    await tx.query("INSERT INTO api_keys (key_hash, account_id) VALUES ($1, $2)", [hashApiKey(apiKey), id]);
  });
  return { id, apiKey };
}

export async function ensureDemoAccounts(db: Db): Promise<void> {
  for (const a of DEMO_ACCOUNTS) {
    await db.query("INSERT INTO accounts (id, name) VALUES ($1, $2) ON CONFLICT DO NOTHING", [a.id, a.name]);
    await db.query("INSERT INTO api_keys (key_hash, account_id) VALUES ($1, $2) ON CONFLICT DO NOTHING", [
      hashApiKey(a.apiKey),
      a.id,
    ]);
  }
}

/**
 * Revoke an API key: its row is deleted, so it authenticates nothing from now on. Returns whether the
 * key existed. Other processes' caches (`ApiKeys`) may accept it for new requests for up to their TTL,
 * but never to replay a saved answer: the keyed routes re-check it uncached (`accountForUncached`).
 */
export async function revokeApiKey(db: Db, apiKey: string): Promise<boolean> {
  const { rowCount } = await db.query("DELETE FROM api_keys WHERE key_hash = $1", [hashApiKey(apiKey)]);
  return (rowCount ?? 0) > 0;
}

/**
 * API key -> account id, with a short in-memory cache so that authentication costs no round trip on
 * the hot path. A revoked key stops working within `ttlMs`; `accountForUncached` sees it at once.
 */
export class ApiKeys {
  private cache = new Map<string, { account: string | undefined; until: number }>();
  constructor(
    private readonly db: Db,
    private readonly ttlMs = 30_000,
  ) {}

  async accountFor(apiKey: string): Promise<string | undefined> {
    const hit = this.cache.get(hashApiKey(apiKey).toString("hex"));
    if (hit && hit.until > Date.now()) return hit.account;
    return this.accountForUncached(apiKey);
  }

  /** The database's answer now (one round trip), which also refreshes the cache. */
  async accountForUncached(apiKey: string): Promise<string | undefined> {
    const hash = hashApiKey(apiKey);
    const k = hash.toString("hex");
    const now = Date.now();
    const { rows } = await this.db.query<{ account_id: string }>(
      "SELECT account_id FROM api_keys WHERE key_hash = $1",
      [hash],
    );
    const account = rows[0]?.account_id;
    if (this.cache.size > 10_000) this.cache.clear();
    this.cache.set(k, { account, until: now + this.ttlMs });
    return account;
  }
}
