/**
 * Why home regions: two regions, each a PostgreSQL cluster of its own on this machine, with the keys
 * table of region A replicated to region B by asynchronous logical replication. A client pays in A,
 * loses the reply, and its retry lands in B while replication lags (modelled by pausing the subscription):
 *
 *   - without home-region routing, B does not know the key yet and charges a second time;
 *   - with routing, B forwards the retry to A, the account's home, which replays the first reply.
 *
 * Both clusters are created with initdb in temporary directories on free loopback ports, and stopped and
 * deleted afterwards, even when a test fails. Skipped, with a message, when initdb is not installed.
 */
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { type Context, Hono } from "hono";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { idempotency } from "../../src/http/hono.ts";
import { homeRegion } from "../../src/http/hono-home-region.ts";
import type { Db } from "../../src/postgres/db.ts";
import { fromPg } from "../../src/postgres/drivers/pg.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { type Cluster, freePort, postgresBinDir, startCluster } from "../helpers/cluster.ts";

const bin = postgresBinDir();
if (!bin) {
  console.warn(
    "test/regions/replication.slow.test.ts skipped: PostgreSQL's server binaries (initdb, pg_ctl) were not found " +
      "(install postgresql, or set PG_BINDIR)",
  );
}

const ACCOUNT = "acct_eu"; // homed in region A
const HOMES: Record<string, string> = { [ACCOUNT]: "a" };
const scope = (c: Context) => /^Bearer (\S+)$/.exec(c.req.header("authorization") ?? "")?.[1];

interface Region {
  name: string;
  cluster: Cluster;
  db: Db;
}

interface Service {
  url: string;
  close(): Promise<void>;
}

/** A region's payment service: keys and payments in its own cluster; optionally home-region routing. */
function startService(region: Region, routing?: { targets: Record<string, string> }): Promise<Service> {
  return PostgresStore.open(region.db).then((store) => {
    const app = new Hono();
    if (routing) {
      app.use(
        "/v1/payments",
        homeRegion({ region: region.name, homeOf: (a) => HOMES[a], targets: routing.targets, scope }),
      );
    }
    app.post("/v1/payments", idempotency({ store, scope }), async (c) => {
      const { amount_cents } = await c.req.json();
      const { tx, scope: account } = c.var.idempotency;
      const { rows } = await tx.query<{ id: number }>(
        "INSERT INTO payments (account, amount_cents, region) VALUES ($1, $2, $3) RETURNING id",
        [account, amount_cents, region.name],
      );
      return c.json({ id: `${region.name}_${rows[0]!.id}`, amount_cents, region: region.name }, 201);
    });
    return new Promise<Service>((resolve) => {
      const server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, (info: AddressInfo) =>
        resolve({
          url: `http://127.0.0.1:${info.port}`,
          close: () =>
            new Promise<void>((done) => {
              (server as import("node:http").Server).closeAllConnections?.();
              server.close(() => done());
            }),
        }),
      );
    });
  });
}

const pay = (service: Service, key: string) =>
  fetch(`${service.url}/v1/payments`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${ACCOUNT}`,
      "idempotency-key": key,
      "content-type": "application/json",
    },
    body: JSON.stringify({ amount_cents: 5000 }),
  });

async function charges(region: Region): Promise<number> {
  const { rows } = await region.db.query<{ n: number }>("SELECT count(*)::int AS n FROM payments");
  return rows[0]!.n;
}

async function hasKey(region: Region, key: string): Promise<boolean> {
  const { rows } = await region.db.query("SELECT 1 FROM idem.keys WHERE scope = $1 AND key = $2", [
    ACCOUNT,
    key,
  ]);
  return rows.length > 0;
}

async function until(what: string, check: () => Promise<boolean>, timeoutMs = 15_000): Promise<number> {
  const started = Date.now();
  while (!(await check())) {
    if (Date.now() - started > timeoutMs) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return Date.now() - started;
}

describe.skipIf(!bin)("two regions with asynchronous replication of the keys table", () => {
  const clusters: Cluster[] = [];
  const pools: pg.Pool[] = [];
  const services: Service[] = [];
  let a: Region;
  let b: Region;
  /** A and B without routing (each processes what it receives), and B with home-region routing. */
  let serviceA: Service;
  let plainB: Service;
  let routedB: Service;

  beforeAll(async () => {
    const portA = await freePort(54329);
    const portB = await freePort(portA === 54329 ? 54330 : 0);
    // A publishes (wal_level=logical); B subscribes. Started side by side: initdb takes a few seconds.
    const [clusterA, clusterB] = await Promise.all([
      startCluster("a", { bin: bin!, port: portA, settings: { wal_level: "logical" } }),
      startCluster("b", { bin: bin!, port: portB }),
    ]);
    clusters.push(clusterA, clusterB);
    const region = (name: string, cluster: Cluster): Region => {
      const pool = new pg.Pool({ connectionString: cluster.url, max: 8 });
      pools.push(pool);
      return { name, cluster, db: fromPg(pool) };
    };
    a = region("a", clusterA);
    b = region("b", clusterB);
    for (const r of [a, b]) {
      await migrate(r.db);
      await r.db.exec(
        "CREATE TABLE payments (id serial PRIMARY KEY, account text NOT NULL, amount_cents int NOT NULL, region text NOT NULL)",
      );
      await PostgresStore.open(r.db); // the partitions for now, on both sides
    }
    // Replicate A's keys to B (through the partitioned root, so new partitions are included).
    await a.db.exec(
      "CREATE PUBLICATION idem_keys FOR TABLE idem.keys WITH (publish_via_partition_root = true)",
    );
    await b.db.exec(
      `CREATE SUBSCRIPTION idem_keys CONNECTION 'host=127.0.0.1 port=${clusterA.port} user=postgres dbname=postgres'
         PUBLICATION idem_keys WITH (disable_on_error = true)`,
    );
    await until("the initial table sync", async () => {
      const { rows } = await b.db.query("SELECT 1 FROM pg_subscription_rel WHERE srsubstate <> 'r'");
      return rows.length === 0;
    });

    serviceA = await startService(a, { targets: {} }); // A is the account's home: it never forwards
    services.push(serviceA);
    plainB = await startService(b);
    services.push(plainB);
    routedB = await startService(b, { targets: { a: serviceA.url } });
    services.push(routedB);
  }, 90_000);

  afterAll(async () => {
    for (const s of services) await s.close().catch(() => {});
    for (const p of pools) await p.end().catch(() => {});
    // Subscriber first, then publisher; each stop also deletes the cluster's directory.
    for (const c of clusters.reverse()) await c.stop();
  }, 60_000);

  /** Replication lag: B's subscription stops applying A's changes until `resume()`. */
  async function pauseReplication(): Promise<void> {
    await b.db.exec("ALTER SUBSCRIPTION idem_keys DISABLE");
    await until("the apply worker to stop", async () => {
      const { rows } = await b.db.query(
        "SELECT 1 FROM pg_stat_subscription WHERE subname = 'idem_keys' AND pid IS NOT NULL",
      );
      return rows.length === 0;
    });
  }

  it("replays in B once replication has caught up, even without routing", async () => {
    const first = await pay(serviceA, "k-caught-up");
    expect(first.status).toBe(201);
    const lagMs = await until("the key to reach B", () => hasKey(b, "k-caught-up"));
    const retry = await pay(plainB, "k-caught-up");
    expect(retry.status).toBe(201);
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(await retry.json()).toEqual(await first.json());
    expect((await charges(a)) + (await charges(b))).toBe(1);
    console.log(`replication of one key row A -> B took ${lagMs} ms`);
  });

  it("charges twice without routing: the retry lands in B during replication lag", async () => {
    await pauseReplication();
    const before = (await charges(a)) + (await charges(b));
    const first = await pay(serviceA, "k-lag-plain"); // the reply is lost on its way to the client
    expect(first.status).toBe(201);
    const retry = await pay(plainB, "k-lag-plain"); // DNS failover: the retry goes to region B
    expect(retry.status).toBe(201);
    expect(retry.headers.get("idempotent-replayed")).toBeNull();
    expect(await hasKey(b, "k-lag-plain")).toBe(true); // B claimed the key for itself
    const effects = (await charges(a)) + (await charges(b)) - before;
    expect(effects).toBe(2);
    expect(((await first.json()) as { region: string }).region).toBe("a");
    expect(((await retry.json()) as { region: string }).region).toBe("b");
    console.log(`without home-region routing: ${effects} charges for one key`);
  });

  it("charges once with routing: B forwards the retry to the account's home, which replays it", async () => {
    await pauseReplication(); // still paused from the previous test, or paused now when run alone
    const before = (await charges(a)) + (await charges(b));
    const chargesInB = await charges(b);
    const first = await pay(serviceA, "k-lag-routed");
    const firstBody = await first.json();
    expect(await hasKey(b, "k-lag-routed")).toBe(false); // the lag: B has not seen the key
    const retry = await pay(routedB, "k-lag-routed");
    expect(retry.status).toBe(201);
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(retry.headers.get("via")).toBe("1.1 idem-b");
    expect(await retry.json()).toEqual(firstBody);
    const effects = (await charges(a)) + (await charges(b)) - before;
    expect(effects).toBe(1);
    expect(await charges(b)).toBe(chargesInB); // nothing ran in B
    console.log(`with home-region routing: ${effects} charge for one key`);
  });

  it("answers 503 with Retry-After and runs nothing in B while the home region is unreachable", async () => {
    const isolated = await startService(b, { targets: { a: "http://127.0.0.1:9" } }); // nobody listens on 9
    services.push(isolated);
    const before = await charges(b);
    const res = await pay(isolated, "k-home-down");
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBe("1");
    expect(await res.json()).toMatchObject({
      type: "urn:idem:problem:home-region-unreachable",
      home_region: "a",
    });
    expect(await charges(b)).toBe(before);
    expect(await hasKey(b, "k-home-down")).toBe(false);
  });

  it("finds the double charge only after the fact: replication then conflicts on B's own copy of the key", async () => {
    // The unrouted retry left a row for k-lag-plain in B. When replication resumes, A's row for the same
    // key collides with it; the subscription (disable_on_error) stops. Only reconciliation can fix this.
    await b.db.exec("ALTER SUBSCRIPTION idem_keys ENABLE");
    await until("the conflict to disable the subscription", async () => {
      const { rows } = await b.db.query<{ enabled: boolean; errors: number }>(
        `SELECT s.subenabled AS enabled, coalesce(st.apply_error_count, 0)::int AS errors
           FROM pg_subscription s LEFT JOIN pg_stat_subscription_stats st ON st.subid = s.oid
          WHERE s.subname = 'idem_keys'`,
      );
      return rows[0]!.errors > 0 && !rows[0]!.enabled;
    });
    expect(await b.cluster.log()).toMatch(/duplicate key value violates unique constraint/);
  });
});
