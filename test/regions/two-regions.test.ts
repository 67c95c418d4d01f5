/**
 * The reference service as two regions (app/regions.ts): two services, two databases, one home region
 * per account. A payment sent to the wrong region is forwarded to the account's home with its key, so
 * its retries, wherever they land, replay the one payment; each region's database holds only its own
 * accounts' keys and payments.
 */
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import type { Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ApiKeys, DEMO_ACCOUNTS, ensureDemoAccounts } from "../../app/accounts.ts";
import { createApp } from "../../app/app.ts";
import { regionsFromEnv } from "../../app/config.ts";
import { prepareSchema } from "../../app/database.ts";
import { createLogger } from "../../app/observability.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { type Provider, startProvider } from "../../src/testing/provider.ts";
import type { OpenDb } from "../helpers/db.ts";
import { serverOrEmbedded } from "../phases/helpers.ts";

const [EU_ACCOUNT, US_ACCOUNT] = [DEMO_ACCOUNTS[0], DEMO_ACCOUNTS[1]];

describe.each(serverOrEmbedded.slice(0, 1))("two regions on $name", (backend) => {
  const regions: Record<string, { url: string; open: OpenDb; store: PostgresStore; close(): Promise<void> }> =
    {};
  let provider: Provider;

  beforeAll(async () => {
    provider = await startProvider({ seed: 9 });
    const apps: Record<string, Hono> = {};
    // Listen first (each region must know the other's URL), then build the apps.
    for (const name of ["eu", "us"]) {
      const server = serve({ fetch: (r) => apps[name]!.fetch(r), port: 0, hostname: "127.0.0.1" });
      await new Promise<void>((r) => server.once("listening", () => r()));
      const open = await backend.open();
      await prepareSchema(open.db);
      await ensureDemoAccounts(open.db);
      regions[name] = {
        url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
        open,
        store: await PostgresStore.open(open.db),
        async close() {
          (server as import("node:http").Server).closeAllConnections();
          await new Promise<void>((r) => server.close(() => r()));
          await open.close();
        },
      };
    }
    for (const name of ["eu", "us"]) {
      const { open, store } = regions[name]!;
      apps[name] = createApp({
        db: open.db,
        store,
        apiKeys: new ApiKeys(open.db),
        providerUrl: provider.url,
        logger: createLogger({ level: "silent" }),
        regions: regionsFromEnv({
          IDEM_REGION: name,
          IDEM_REGION_URLS: `eu=${regions.eu!.url},us=${regions.us!.url}`,
          IDEM_ACCOUNT_HOMES: `${EU_ACCOUNT.id}=eu,${US_ACCOUNT.id}=us`,
        }),
      });
    }
  });
  afterAll(async () => {
    for (const r of Object.values(regions)) await r.close();
    await provider?.close();
  });

  const pay = (region: string, apiKey: string, key: string) =>
    fetch(`${regions[region]!.url}/v1/payments`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${apiKey}`,
        "content-type": "application/json",
        "idempotency-key": key,
      },
      body: JSON.stringify({ amount_cents: 4_500, currency: "eur" }),
    });
  const payments = async (region: string) =>
    (await regions[region]!.open.db.query<{ n: number }>("SELECT count(*)::int AS n FROM payments")).rows[0]!
      .n;

  it("a payment landing in the wrong region runs once, at home; retries anywhere replay it", async () => {
    const first = await pay("us", EU_ACCOUNT.apiKey, "two-regions-1");
    expect(first.status).toBe(201);
    const body = await first.text();
    for (const region of ["eu", "us", "eu"]) {
      const again = await pay(region, EU_ACCOUNT.apiKey, "two-regions-1");
      expect(again.status).toBe(201);
      expect(again.headers.get("idempotent-replayed")).toBe("true");
      expect(await again.text()).toBe(body);
    }
    expect(await regions.eu!.store.inspect(EU_ACCOUNT.id, "two-regions-1")).toMatchObject({ state: "done" });
    expect(await regions.us!.store.inspect(EU_ACCOUNT.id, "two-regions-1")).toBeUndefined();
    const claimId = (await regions.eu!.store.inspect(EU_ACCOUNT.id, "two-regions-1"))!.claimId;
    expect(
      provider.charges().filter((c) => c.idempotency_key === `${EU_ACCOUNT.id}:${claimId}`),
    ).toHaveLength(1);
  });

  it("each region's database holds only its own accounts' payments", async () => {
    expect((await pay("eu", US_ACCOUNT.apiKey, "two-regions-2")).status).toBe(201);
    expect(await regions.us!.store.inspect(US_ACCOUNT.id, "two-regions-2")).toMatchObject({ state: "done" });
    expect([await payments("eu"), await payments("us")]).toEqual([1, 1]);
  });

  it("refuses a region map that names a region without a URL", () => {
    expect(() => regionsFromEnv({ IDEM_REGION: "eu", IDEM_REGION_URLS: "us=http://x" })).toThrow(/no URL/);
    expect(regionsFromEnv({})).toBeUndefined();
  });
});
