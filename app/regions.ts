/**
 * The reference service as several regions (issue 17): each region is a process on its own database;
 * every account has a home region, where its keys and its payments live. A write that lands in another
 * region is forwarded to the home region with its Idempotency-Key (idem's `homeRegion`), so a retry
 * finds its key wherever it lands and nothing runs twice. Reads are served where they land.
 *
 *   IDEM_REGION=eu IDEM_REGION_URLS=eu=http://127.0.0.1:3001,us=http://127.0.0.1:3002 \
 *     IDEM_ACCOUNT_HOMES=acct_demo_1=eu,acct_demo_2=us PORT=3001 DATABASE_URL=.../eu npm start
 *   (the same with IDEM_REGION=us, PORT=3002 and us's database for the second region)
 *
 * Accounts without an entry are served wherever they land.
 */
import type { MiddlewareHandler } from "hono";
import { homeRegion } from "idem/hono-home-region";
import type { ApiKeys } from "./accounts.ts";

export interface Regions {
  /** This process's region. */
  region: string;
  /** Every region's base URL. */
  urls: Record<string, string>;
  /** Account id -> home region. */
  homes: Record<string, string>;
}

function pairs(name: string, text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of text.split(",").filter((p) => p.trim())) {
    const at = part.indexOf("=");
    if (at <= 0) throw new Error(`${name}: write it as name=value,name=value (got "${part}")`);
    out[part.slice(0, at).trim()] = part.slice(at + 1).trim();
  }
  return out;
}

/** The regions from IDEM_REGION, IDEM_REGION_URLS and IDEM_ACCOUNT_HOMES; undefined without IDEM_REGION. */
export function regionsFromEnv(env: NodeJS.ProcessEnv): Regions | undefined {
  const region = env.IDEM_REGION?.trim();
  if (!region) return undefined;
  const urls = pairs("IDEM_REGION_URLS", env.IDEM_REGION_URLS ?? "");
  const homes = pairs("IDEM_ACCOUNT_HOMES", env.IDEM_ACCOUNT_HOMES ?? "");
  for (const home of [region, ...Object.values(homes)]) {
    if (!(home in urls)) throw new Error(`IDEM_REGION_URLS has no URL for the region "${home}"`);
  }
  return { region, urls, homes };
}

/**
 * Forward writes of accounts homed elsewhere to their home region. Put it before the routes: it
 * authenticates by API key only to learn the account (an unknown key goes on, and is answered 401).
 */
export function regionRouting(regions: Regions, apiKeys: ApiKeys): MiddlewareHandler {
  return homeRegion({
    region: regions.region,
    targets: regions.urls,
    homeOf: (account) => regions.homes[account],
    scope: async (c) => {
      const m = /^Bearer\s+(\S+)\s*$/i.exec(c.req.header("authorization") ?? "");
      return m ? apiKeys.accountFor(m[1]!) : undefined;
    },
  });
}
