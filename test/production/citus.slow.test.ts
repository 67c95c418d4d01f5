/**
 * idem on Citus 13 (coordinator + 2 workers on loopback, test/infra/citus.ts): `migrate` distributes
 * idem's tables with no setting; the per-key lock holds across nodes (duplicates sent to instances on
 * the coordinator and on both workers: one execution, the others replay the same bytes); a sweep drops
 * an expired distributed partition; the HTTP protocol suite passes in atomic and phases mode.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isKeyInFlightError, type StoredResponse } from "../../src/core/index.ts";
import { audit, builtinChecks } from "../../src/postgres/admin/audit.ts";
import { complete } from "../../src/postgres/admin/complete.ts";
import type { Db } from "../../src/postgres/db.ts";
import { openDatabaseUrl } from "../../src/postgres/drivers/connect.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { Partitions } from "../../src/postgres/schema/partitions.ts";
import { SingleStatementStore, StatementModeError } from "../../src/postgres/statement/store.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { pay, startService } from "../app/service.ts";
import { paymentClaim } from "../helpers/claim.ts";
import { DATABASE_URL, type TestBackend } from "../helpers/db.ts";
import { paymentsContract, useApp } from "../http/contract.ts";
import { lifecycleContract } from "../http/contract-lifecycle.ts";
import { startHono } from "../http/hono-app.ts";
import {
  type CitusCluster,
  type CitusDatabase,
  type CitusNode,
  citusUnavailable,
  startCitus,
} from "../infra/citus.ts";

const why = DATABASE_URL && process.env.CI ? citusUnavailable() : "needs CI=true and DATABASE_URL";

let citus: CitusCluster;
beforeAll(async () => {
  if (why) return;
  citus = await startCitus();
}, 60_000);
afterAll(async () => {
  await citus?.stop();
});

async function open(url: string): Promise<Db> {
  return (await openDatabaseUrl(url)).db;
}

/** A fresh Citus database reached through the coordinator (for the shared suites). */
const onCoordinator: TestBackend = {
  name: "pg",
  async open() {
    const d = await citus.database();
    const db = await open(d.url());
    return {
      db,
      url: d.url(),
      async close() {
        await db.close();
        await d.drop();
      },
    };
  },
};

/** The database `d` reached through one node (closing it leaves the database). */
function through(d: CitusDatabase, node: CitusNode): TestBackend {
  return {
    name: "pg",
    async open() {
      // The reference service's own pool size (app/database.ts).
      const { db } = await openDatabaseUrl(d.url(node), { max: 20 });
      return { db, url: d.url(node), close: () => db.close() };
    },
  };
}

const enc = new TextEncoder();
const dec = new TextDecoder();

describe.skipIf(why)("idem on Citus", () => {
  let d: CitusDatabase;
  const dbs: Partial<Record<CitusNode, Db>> = {};
  beforeAll(async () => {
    d = await citus.database();
    dbs.coordinator = await open(d.url("coordinator"));
    const result = await migrate(dbs.coordinator);
    expect(result.citus).toEqual(expect.arrayContaining(["keys", "key_locks", "settings", "outbox"]));
    // The tenant's business rows: distributed by the same value as idem's scope, colocated with keys.
    await dbs.coordinator.exec(
      `CREATE TABLE effects (scope text NOT NULL, id bigserial, note text NOT NULL, PRIMARY KEY (scope, id));
       SELECT create_distributed_table('effects', 'scope', colocate_with => 'idem.keys')`,
    );
    dbs.worker1 = await open(d.url("worker1"));
    dbs.worker2 = await open(d.url("worker2"));
  }, 60_000);
  afterAll(async () => {
    for (const db of Object.values(dbs)) await db?.close();
    await d?.drop();
  });

  it("migrate places idem's tables (keys by scope, partitions too) and is then a no-op", async () => {
    const { rows } = await dbs.coordinator!.query<{ t: string; m: string; col: string | null }>(
      `SELECT logicalrelid::text AS t, partmethod AS m, column_to_column_name(logicalrelid, partkey) AS col
         FROM pg_dist_partition WHERE logicalrelid::text LIKE 'idem.%' ORDER BY 1`,
    );
    const placed = Object.fromEntries(rows.map((r) => [r.t, r.m === "h" ? `by ${r.col}` : "reference"]));
    expect(placed["idem.keys"]).toBe("by scope");
    expect(placed["idem.key_locks"]).toBe("by scope");
    expect(placed["idem.inbox"]).toBe("by message_id");
    expect(placed["idem.settings"]).toBe("reference");
    expect(placed["idem.reviews"]).toBe("reference");
    const partitions = rows.filter((r) => /^idem\.keys_b\d+$/.test(r.t));
    expect(partitions.length).toBeGreaterThanOrEqual(3);
    expect(partitions.every((r) => r.col === "scope")).toBe(true);
    expect(await migrate(dbs.coordinator!)).toEqual({ applied: [] });
    // The outbox's NOTIFY trigger is gone here, and cannot be put back: it would fail two-phase commits.
    await expect(migrate(dbs.coordinator!, { outboxNotify: true })).rejects.toThrow(/refused on Citus/);
    const { rows: triggers } = await dbs.coordinator!.query(
      "SELECT 1 FROM pg_trigger WHERE tgrelid = 'idem.outbox'::regclass AND tgname = 'outbox_notify'",
    );
    expect(triggers).toEqual([]);
    // Any node takes the service's queries (metadata is synced to the workers).
    const onWorker = await PostgresStore.open(dbs.worker2!);
    expect(onWorker).toBeInstanceOf(PostgresStore);
  });

  it("refuses single-statement mode, whose lock and boundary marker assume one node", async () => {
    const store = await PostgresStore.open(dbs.coordinator!);
    expect(store.distributed).toBe(true);
    expect(() => new SingleStatementStore(store)).toThrow(StatementModeError);
  });

  it("serialises duplicates across nodes: one execution, every other replays the same bytes", async () => {
    const stores = {
      coordinator: await PostgresStore.open(dbs.coordinator!, { lockTimeoutMs: 20_000 }),
      worker1: await PostgresStore.open(dbs.worker1!, { lockTimeoutMs: 20_000 }),
      worker2: await PostgresStore.open(dbs.worker2!, { lockTimeoutMs: 20_000 }),
    };
    const nodes = ["coordinator", "worker1", "worker2"] as const;
    const scope = `acct_${Date.now()}`;
    const claim = paymentClaim(scope, "storm-1", '{"amount_cents":100}');
    let executions = 0;
    const outcomes = await Promise.all(
      Array.from({ length: 48 }, (_, i) =>
        stores[nodes[i % 3]!].atomic(claim, async (tx) => {
          executions++;
          const { rows } = await tx.query<{ id: string }>(
            "INSERT INTO effects (scope, note) VALUES ($1, $2) RETURNING id::text AS id",
            [scope, `from ${nodes[i % 3]}`],
          );
          await new Promise((r) => setTimeout(r, 50)); // hold the lock while the others arrive
          const response: StoredResponse = {
            status: 201,
            headers: [["content-type", "application/json"]],
            body: enc.encode(JSON.stringify({ id: rows[0]!.id })),
          };
          return { response, save: response };
        }),
      ),
    );
    expect(executions).toBe(1);
    const { rows } = await dbs.worker1!.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM effects WHERE scope = $1",
      [scope],
    );
    expect(rows[0]!.n).toBe(1);
    const bodies = new Set(outcomes.map((o) => dec.decode(o.response.body)));
    expect(bodies.size).toBe(1);
    expect(outcomes.filter((o) => o.kind === "executed")).toHaveLength(1);
    expect(outcomes.filter((o) => o.kind === "replayed")).toHaveLength(47);
    // The operator's tools read across shards: inspect (from a worker), audit, the completer.
    const inspected = await stores.worker2.inspect(scope, "storm-1");
    expect(inspected).toBeDefined();
    const results = await audit(dbs.worker1!, builtinChecks());
    expect(results.length).toBeGreaterThan(0);
    expect(results.filter((r) => r.violations > 0).map((r) => r.name)).toEqual([]);
    const report = await complete({ store: stores.coordinator, runners: [], dryRun: true });
    expect(report).toBeDefined();
  }, 60_000);

  it("a duplicate on another node waits at most lockTimeoutMs, then says in flight", async () => {
    const a = await PostgresStore.open(dbs.worker1!, { lockTimeoutMs: 300 });
    const b = await PostgresStore.open(dbs.worker2!, { lockTimeoutMs: 300 });
    const claim = paymentClaim("acct_busy", "busy-1", "{}");
    let release!: () => void;
    const held = new Promise<void>((r) => {
      release = r;
    });
    let started!: () => void;
    const inside = new Promise<void>((r) => {
      started = r;
    });
    const first = a.atomic(claim, async () => {
      started();
      await held;
      const response: StoredResponse = { status: 201, headers: [], body: enc.encode("ok") };
      return { response, save: response };
    });
    await inside;
    const t0 = Date.now();
    const second = await b
      .atomic(claim, async () => {
        throw new Error("must not run");
      })
      .catch((e: unknown) => e);
    expect(isKeyInFlightError(second)).toBe(true);
    expect(Date.now() - t0).toBeLessThan(5_000);
    release();
    expect((await first).kind).toBe("executed");
    const again = await b.atomic(claim, async () => {
      throw new Error("must not run");
    });
    expect(again.kind).toBe("replayed");
  }, 30_000);

  it("sweep drops an expired day's distributed partition (plain DETACH: Citus has no CONCURRENTLY)", async () => {
    const store = await PostgresStore.open(dbs.coordinator!);
    const parts = new Partitions(dbs.coordinator!, "idem", 86_400_000);
    const today = parts.bucketOf(Date.now());
    await parts.ensure([today - 5]);
    const before = await parts.list();
    expect(before).toContain(today - 5);
    const { dropped } = await store.sweep();
    expect(dropped).toContain(today - 5);
    expect(await parts.list()).not.toContain(today - 5);
    const { rows } = await dbs.coordinator!.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM pg_dist_partition WHERE logicalrelid::text = $1",
      [`idem.keys_b${today - 5}`],
    );
    expect(rows[0]!.n).toBe(0);
  }, 60_000);
});

describe.skipIf(why)("the protocol suite on a Citus coordinator", () => {
  const app = useApp(onCoordinator, startHono);
  // Atomic routes (/v1/payments, /v1/tips), then the lifecycle cases, which include the phases route
  // (/v1/phased: an external then a local phase, 422, 400, 409 operation-uncertain).
  paymentsContract(app, { hangUp: true });
  lifecycleContract(app);
});

/**
 * Concurrent duplicates per mode. Phases mode once answered 22 of 50 with 503 (the pool's 5 s wait
 * for a connection): the duplicates' claim (INSERT ... ON CONFLICT DO UPDATE ... WHERE expired) locked
 * the first one's key row and queued one after another on the shard's node (sampled: about 10 backends
 * waiting on a tuple lock), each until its remote commit. The claim now does nothing on a conflict.
 */
const DUPLICATES = { atomic: 50, phases: 50 } as const;

describe.skipIf(why)("the reference service on a coordinator and a worker", () => {
  describe.each(["atomic", "phases"] as const)("in %s mode", (mode) => {
    it("answers concurrent duplicates sent half to each with one payment and no 5xx", async () => {
      const d = await citus.database();
      const a = await startService(through(d, "coordinator"), { paymentsMode: mode });
      // As app/main.ts starts: the schema is current, so the instance on a worker runs no DDL.
      const b = await startService(through(d, "worker2"), { paymentsMode: mode, ensureSchema: true });
      try {
        expect(
          await a.count(
            "SELECT count(*) AS n FROM pg_dist_partition WHERE logicalrelid = 'payments'::regclass",
          ),
        ).toBe(1);
        const key = `storm-${mode}`;
        const replies = await Promise.all(
          Array.from({ length: DUPLICATES[mode] }, (_, i) => pay(i % 2 ? b.url : a.url, { key })),
        );
        const statuses = replies.map((r) => r.status);
        expect(statuses.filter((s) => s >= 500)).toEqual([]);
        // Atomic: every duplicate waits and replays. Phases: the others are told 409 in flight.
        expect(statuses.every((s) => s === 201 || (mode === "phases" && s === 409))).toBe(true);
        const bodies = new Set(
          await Promise.all(replies.filter((r) => r.status === 201).map((r) => r.text())),
        );
        // Phases mode: under load the first one may answer 409 itself once its answer budget ran out
        // (the payment goes on in the background); whatever answered 201 answered the same bytes.
        if (mode === "atomic") expect(bodies.size).toBe(1);
        else expect(bodies.size).toBeLessThanOrEqual(1);
        let again = await pay(b.url, { key });
        for (let i = 0; again.status === 409 && i < 50; i++) {
          await new Promise((r) => setTimeout(r, 200));
          again = await pay(b.url, { key });
        }
        expect(again.status).toBe(201);
        expect(again.headers.get("idempotent-replayed")).toBe("true");
        const replayed = await again.text();
        if (bodies.size) expect(replayed).toBe([...bodies][0]);
        expect(await b.count("SELECT count(*) AS n FROM payments")).toBe(1);
      } finally {
        await a.stop();
        await b.stop();
        await d.drop();
      }
    }, 90_000);
  });
});
