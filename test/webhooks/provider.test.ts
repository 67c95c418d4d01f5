/**
 * The reference service's `POST /v1/webhooks/provider` against the provider simulator, which sends
 * each charge's events at least once: late, reordered, duplicated, and (through a proxy that cuts
 * one reply in five after the service answered) retried after they were applied. Once the simulator
 * is idle, the service's charges are the provider's, state for state.
 */
import { createHmac, randomBytes } from "node:crypto";
import { createServer, request as httpRequest, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { describe, expect, it } from "vitest";
import { ApiKeys } from "../../app/accounts.ts";
import { createApp } from "../../app/app.ts";
import { prepareSchema } from "../../app/database.ts";
import { createLogger } from "../../app/observability.ts";
import type { Db } from "../../src/postgres/db.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { startProvider } from "../../src/testing/provider.ts";
import { backends } from "../helpers/db.ts";

function address(server: Server): string {
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

/** A proxy to `target` that, for one request in `cutEvery`, forwards it and then drops the reply. */
async function lossyProxy(
  target: string,
  cutEvery: number,
): Promise<{ url: string; cut: () => number; close(): Promise<void> }> {
  let n = 0;
  let cut = 0;
  const server = createServer((req, res) => {
    const drop = ++n % cutEvery === 0;
    const upstream = httpRequest(
      `${target}${req.url}`,
      { method: req.method, headers: req.headers },
      (up) => {
        if (drop) {
          cut++;
          up.resume();
          up.on("end", () => res.destroy()); // the service applied it; the provider never hears so
          return;
        }
        res.writeHead(up.statusCode ?? 502, up.headers);
        up.pipe(res);
      },
    );
    upstream.on("error", () => res.destroy());
    req.pipe(upstream);
  });
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok));
  return {
    url: address(server),
    cut: () => cut,
    close: () => new Promise<void>((ok) => server.close(() => ok())),
  };
}

/** The reference service (atomic payments) on `db`, taking the provider's webhooks signed with `secret`. */
async function serviceApp(db: Db, secret: string, adminTokens?: string) {
  await prepareSchema(db);
  return createApp({
    db,
    store: await PostgresStore.open(db),
    apiKeys: new ApiKeys(db),
    paymentsMode: "atomic",
    logger: createLogger({ level: "silent" }),
    metricsEndpoint: false,
    providerWebhookSecret: secret,
    adminTokens,
  });
}

describe.each(backends)("provider webhooks into the reference service on $name", (backend) => {
  it("charges sent at least once, reordered and duplicated: the service's state matches the provider's", async () => {
    const open = await backend.open();
    const secret = `whsec_${randomBytes(16).toString("hex")}`;
    const app = await serviceApp(open.db, secret);
    const service = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }) as Server;
    await new Promise((ok) => service.once("listening", ok));
    const proxy = await lossyProxy(address(service), 5);
    const provider = await startProvider({
      seed: 61,
      declineAmounts: [402],
      webhooks: {
        url: `${proxy.url}/v1/webhooks/provider`,
        secret,
        delayMs: [0, 40],
        reorderRate: 0.4,
        duplicateRate: 0.3,
        seed: 61,
      },
    });
    try {
      const amounts = Array.from({ length: 40 }, (_, i) => (i % 7 === 3 ? 402 : 1000 + i));
      await Promise.all(
        amounts.map((amount, i) =>
          fetch(`${provider.url}/v1/charges`, {
            method: "POST",
            headers: { "content-type": "application/json", "idempotency-key": `k-${i}` },
            body: JSON.stringify({ amount, currency: "eur", reference: `ref-${i}` }),
          }).then((r) => r.arrayBuffer()),
        ),
      );
      await provider.webhooks!.idle();
      const stats = provider.webhooks!.stats();
      expect(stats.events).toBe(80);
      expect(stats.abandoned).toBe(0);
      expect(stats.duplicates).toBeGreaterThan(0);
      expect(proxy.cut()).toBeGreaterThan(0); // replies lost after the effect: those events came again

      const theirs = provider
        .charges()
        .map((c) => ({
          id: c.id,
          amount: c.amount,
          currency: c.currency,
          status: c.status,
          reference: c.reference,
        }))
        .sort((a, b) => a.id.localeCompare(b.id));
      const { rows } = await open.db.query<{
        id: string;
        amount: string;
        currency: string;
        status: string;
        reference: string;
      }>("SELECT id, amount, currency, status, reference FROM provider_charges ORDER BY id");
      const ours = rows
        .map((r) => ({ ...r, amount: Number(r.amount) }))
        .sort((a, b) => a.id.localeCompare(b.id));
      expect(ours).toEqual(theirs);
      expect(theirs.filter((c) => c.status === "failed").length).toBeGreaterThan(0);

      // Every event is marked once: applied, or (a pending event that came after its charge's final
      // one) recorded stale; redeliveries added nothing.
      const marks = await open.db.query<{ status: string; n: string }>(
        "SELECT status, count(*) AS n FROM idem.inbox WHERE consumer = 'provider-charges' AND status <> 'marker' GROUP BY status",
      );
      const byStatus = Object.fromEntries(marks.rows.map((r) => [r.status, Number(r.n)]));
      expect((byStatus.done ?? 0) + (byStatus.stale ?? 0)).toBe(80);
      expect(byStatus.stale ?? 0).toBeGreaterThan(0);
    } finally {
      await provider.close();
      await proxy.close();
      await new Promise<void>((ok) => service.close(() => ok()));
      await open.close();
    }
  }, 60_000);

  it("an event the service cannot apply answers 500, is parked after 5 tries, and the admin API lists it", async () => {
    const open = await backend.open();
    const secret = `whsec_${randomBytes(16).toString("hex")}`;
    const adminToken = randomBytes(16).toString("hex");
    const app = await serviceApp(open.db, secret, `ops:${adminToken}`);
    try {
      // Signed by the provider, but not a charge: the handler throws on it every time.
      const body = JSON.stringify({
        id: "evt_poison",
        object: "event",
        type: "charge.succeeded",
        created: 1,
        data: {},
      });
      const t = Math.floor(Date.now() / 1000);
      const v1 = createHmac("sha256", secret).update(`${t}.${body}`).digest("hex");
      const deliver = () =>
        app.request("/v1/webhooks/provider", {
          method: "POST",
          headers: { "content-type": "application/json", "stripe-signature": `t=${t},v1=${v1}` },
          body,
        });
      const statuses: number[] = [];
      for (let i = 0; i < 6; i++) statuses.push((await deliver()).status);
      expect(statuses).toEqual([500, 500, 500, 500, 200, 200]);
      const res = await app.request("/admin/api/inbox", {
        headers: { authorization: `Bearer ${adminToken}` },
      });
      expect(res.status).toBe(200);
      const { parked } = (await res.json()) as {
        parked: Array<{ consumer: string; messageId: string; attempts: number }>;
      };
      expect(parked).toEqual([
        expect.objectContaining({ consumer: "provider-charges", messageId: "evt_poison", attempts: 5 }),
      ]);
      expect(await open.db.query("SELECT 1 FROM provider_charges")).toMatchObject({ rows: [] });
      const doc = (await (await app.request("/openapi.json")).json()) as {
        paths: Record<string, { post?: unknown }>;
      };
      expect(doc.paths["/v1/webhooks/provider"]?.post).toMatchObject({ operationId: "providerWebhook" });
    } finally {
      await open.close();
    }
  });
});
