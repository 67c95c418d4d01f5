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
