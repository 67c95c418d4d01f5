/**
 * idem's tools on Citus 13 (coordinator + 2 workers on loopback, test/infra/citus.ts): the outbox
 * (a reference table) written in transactions on the coordinator and on a worker and relayed once each,
 * in order per aggregate; the inbox (distributed by message_id) applying each message once; and the
 * operator's commands `idem sweep`, `idem keys list` and `idem audit` against the coordinator.
 */
import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Inbox } from "../../src/messaging/inbox.ts";
import { MemoryBroker } from "../../src/messaging/memory.ts";
import { Relay } from "../../src/messaging/relay.ts";
import type { Delivery, OutboxMessage, PublishOutcome } from "../../src/messaging/types.ts";
import type { Db } from "../../src/postgres/db.ts";
import { openDatabaseUrl } from "../../src/postgres/drivers/connect.ts";
import { jsonResponse } from "../../src/postgres/index.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { definePhases, SimulatedCrashError } from "../../src/postgres/phases/index.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { Partitions } from "../../src/postgres/schema/partitions.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { crashAt } from "../../src/testing/faults.ts";
import { paymentClaim } from "../helpers/claim.ts";
import { idem } from "../helpers/cli.ts";
import { DATABASE_URL } from "../helpers/db.ts";
import { type CitusCluster, type CitusDatabase, citusUnavailable, startCitus } from "../infra/citus.ts";

const why = DATABASE_URL && process.env.CI ? citusUnavailable() : "needs CI=true and DATABASE_URL";

async function until(check: () => boolean, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe.skipIf(why)("idem's tools on Citus", () => {
  let citus: CitusCluster;
  let d: CitusDatabase;
  const dbs: Db[] = [];
  let coordinator: Db;
  let worker1: Db;
  let worker2: Db;
  beforeAll(async () => {
    citus = await startCitus();
    d = await citus.database();
    const open = async (url: string) => {
      const { db } = await openDatabaseUrl(url);
      dbs.push(db);
      return db;
    };
    coordinator = await open(d.url("coordinator"));
    await migrate(coordinator);
    worker1 = await open(d.url("worker1"));
    worker2 = await open(d.url("worker2"));
  }, 90_000);
  afterAll(async () => {
    for (const db of dbs) await db.close();
    await d?.drop();
    await citus?.stop();
  });

  it("relays events written on the coordinator and on a worker once each, in order per aggregate; the inbox applies each once", async () => {
    await coordinator.exec(
      `CREATE TABLE orders (account_id text NOT NULL, seq int NOT NULL, PRIMARY KEY (account_id, seq));
       SELECT create_distributed_table('orders', 'account_id', colocate_with => 'idem.keys');
       CREATE TABLE applied (message_id text NOT NULL, aggregate text NOT NULL, seq int NOT NULL,
                             PRIMARY KEY (message_id));
       SELECT create_distributed_table('applied', 'message_id', colocate_with => 'idem.inbox')`,
    );
    const topic = `citus_${randomBytes(4).toString("hex")}`;
    const aggregates = ["acct_a", "acct_b", "acct_c"];
    const PER = 8;
    // Each event in the transaction of its business row; writers alternate between two nodes.
    for (let seq = 0; seq < PER; seq++) {
      for (const [i, agg] of aggregates.entries()) {
        const db = (seq + i) % 2 ? worker1 : coordinator;
        await db.transaction(async (tx) => {
          await tx.query("INSERT INTO orders (account_id, seq) VALUES ($1, $2)", [agg, seq]);
          await writeOutbox(tx, {
            topic,
            type: "order.placed",
            payload: { agg, seq },
            aggregateType: "account",
            aggregateId: agg,
          });
        });
      }
    }
    // A rolled-back transaction leaves no event behind.
    await expect(
      worker1.transaction(async (tx) => {
        await writeOutbox(tx, { topic, type: "order.placed", payload: { agg: "acct_a", seq: 99 } });
        throw new Error("rolled back");
      }),
    ).rejects.toThrow("rolled back");

    const broker = new MemoryBroker();
    const seen: Delivery[] = [];
    const consumer = broker.consume(topic, {
      inbox: new Inbox(worker2, { consumer: "orders-mirror" }),
      batchSize: 1,
      concurrency: 1,
      handler: async (tx, m) => {
        const { agg, seq } = JSON.parse(m.body) as { agg: string; seq: number };
        await tx.query("INSERT INTO applied (message_id, aggregate, seq) VALUES ($1, $2, $3)", [
          m.id,
          agg,
          seq,
        ]);
        seen.push(m);
      },
    });
    const errors: Error[] = [];
    const relay = new Relay({
      db: worker2,
      publisher: broker.publisher(),
      topics: [topic],
      // Unordered here (the next test relays ordered): one relay loop claims by id, oldest first, so
      // each aggregate's events still go out in order.
      pollMs: 50,
      onError: (e) => errors.push(e),
    });
    const total = aggregates.length * PER;
    await relay.start();
    try {
      await until(() => consumer.stats.applied >= total, 30_000, `${total} applied`);
      // The broker delivers some of them again: the inbox says duplicate, nothing is applied twice.
      for (const m of seen.slice(0, 5)) broker.send(topic, m);
      await until(() => consumer.stats.duplicates >= 5, 10_000, "5 duplicates");
    } finally {
      await relay.stop();
      await consumer.stop();
    }
    expect(errors).toEqual([]);
    expect(relay.stats.published).toBe(total);
    expect(consumer.stats).toMatchObject({ applied: total, duplicates: 5, parked: 0 });
    for (const agg of aggregates) {
      const order = seen.map((m) => JSON.parse(m.body)).filter((p) => p.agg === agg);
      expect(order.map((p) => p.seq)).toEqual([...Array(PER).keys()]);
    }
    const { rows } = await coordinator.query<{ n: number; distinct: number; published: number }>(
      `SELECT (SELECT count(*)::int FROM applied) AS n,
              (SELECT count(DISTINCT message_id)::int FROM applied) AS distinct,
              (SELECT count(*)::int FROM idem.outbox WHERE topic = $1 AND published_at IS NOT NULL) AS published`,
      [topic],
    );
    expect(rows[0]).toEqual({ n: total, distinct: total, published: total });
    const marks = await coordinator.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM idem.inbox WHERE consumer = 'orders-mirror' AND status = 'done'",
    );
    expect(marks.rows[0]!.n).toBe(total);
  }, 60_000);

  it("relays ordered (orderByAggregate) from two nodes at once: each event once, none overtaking an earlier one of its aggregate", async () => {
    const topic = `citus_ord_${randomBytes(4).toString("hex")}`;
    const aggregates = ["ord_a", "ord_b", "ord_c", "ord_d"];
    const PER = 10;
    for (let seq = 0; seq < PER; seq++) {
      for (const [i, agg] of aggregates.entries()) {
        const db = (seq + i) % 2 ? worker1 : coordinator;
        await db.transaction(async (tx) => {
          await writeOutbox(tx, {
            topic,
            type: "order.placed",
            payload: { agg, seq },
            aggregateType: "account",
            aggregateId: agg,
          });
        });
      }
    }
    // The broker refuses ord_a's event 3 the first time: its later events must wait for its retry.
    const delivered: { agg: string; seq: number; id: string }[] = [];
    let refused = 0;
    const publisher = {
      name: "recording",
      async publish(messages: readonly OutboxMessage[]): Promise<PublishOutcome[]> {
        return messages.map((m) => {
          const p = JSON.parse(m.body) as { agg: string; seq: number };
          if (p.agg === "ord_a" && p.seq === 3 && refused++ === 0) {
            return { ok: false as const, error: new Error("refused once") };
          }
          delivered.push({ ...p, id: m.id });
          return { ok: true as const };
        });
      },
      async close() {},
    };
    const errors: Error[] = [];
    const relays = [coordinator, worker2].map(
      (db) =>
        new Relay({
          db,
          publisher,
          topics: [topic],
          orderByAggregate: true,
          concurrency: 2,
          batchSize: 6,
          pollMs: 50,
          backoff: { baseMs: 100, capMs: 100 },
          onError: (e) => errors.push(e),
        }),
    );
    const total = aggregates.length * PER;
    const started = Date.now();
    for (const r of relays) await r.start();
    try {
      await until(() => delivered.length >= total, 30_000, `${total} delivered`).catch((e) => {
        throw new Error(
          `${e.message}: ${delivered.length} so far; ${errors.slice(0, 3).map((x) => x.message)}`,
        );
      });
    } finally {
      for (const r of relays) await r.stop();
    }
    console.log(
      `ordered relay on Citus: ${delivered.length} delivered in ${Date.now() - started} ms, ` +
        `batches ${relays.map((r) => r.stats.batches).join("+")}`,
    );
    expect(errors.map((e) => e.message)).toEqual(["publishing 1 event(s) failed: refused once"]);
    expect(new Set(delivered.map((m) => m.id)).size).toBe(total);
    for (const agg of aggregates) {
      expect(delivered.filter((m) => m.agg === agg).map((m) => m.seq)).toEqual([...Array(PER).keys()]);
    }
    const { rows } = await coordinator.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM idem.outbox WHERE topic = $1 AND published_at IS NOT NULL",
      [topic],
    );
    expect(rows[0]!.n).toBe(total);
  }, 60_000);

  it("idem sweep drops an expired day on the coordinator: exit 0, the bucket in its JSON", async () => {
    const parts = new Partitions(coordinator, "idem", 86_400_000);
    const old = parts.bucketOf(Date.now()) - 6;
    await parts.ensure([old]);
    const run = await idem("sweep", "--json", "--database-url", d.url());
    expect(run.code).toBe(0);
    expect(JSON.parse(run.out).keyPartitions).toContain(old);
    expect(await parts.list()).not.toContain(old);
    const again = await idem("sweep", "--database-url", d.url());
    expect(again.code).toBe(0);
    expect(again.out).toMatch(/^dropped 0 expired key partition\(s\)/);
  }, 60_000);

  it("idem keys list finds an unfinished key across shards, and idem audit flags it: exit 1, then 0 once done", async () => {
    const store = await PostgresStore.open(worker1);
    const run = (faults?: ReturnType<typeof crashAt>) =>
      definePhases<{ n: number }>({
        store,
        name: "citus-cli",
        faults,
        leaseMs: 200,
        phases: { started: { local: async () => ({ response: jsonResponse(201, {}) }) } },
      }).run(paymentClaim("acct_cli", "stuck-1", "{}"), { n: 1 });
    await expect(run(crashAt("after-claim"))).rejects.toBeInstanceOf(SimulatedCrashError);

    const list = await idem("keys", "list", "--state", "unfinished", "--json", "--database-url", d.url());
    expect(list.code).toBe(0);
    expect(JSON.parse(list.out)).toMatchObject([{ scope: "acct_cli", key: "stuck-1", state: "in_progress" }]);

    await new Promise((r) => setTimeout(r, 300)); // past its lease
    const violated = await idem(
      "audit",
      "--lease-seconds",
      "0.1",
      "--max-leases",
      "1",
      "--database-url",
      d.url(),
    );
    expect(violated.code).toBe(1);
    expect(violated.out).toMatch(/VIOLATED\s+unfinished-past-leases.*\(1 row/);
    expect(violated.out).toMatch(/ok\s+one-answer-per-key/);

    expect((await run()).kind).toBe("executed");
    const clean = await idem(
      "audit",
      "--lease-seconds",
      "0.1",
      "--max-leases",
      "1",
      "--database-url",
      d.url(),
    );
    expect(clean.code).toBe(0);
    const none = await idem("keys", "list", "--state", "unfinished", "--json", "--database-url", d.url());
    expect(JSON.parse(none.out)).toEqual([]);
  }, 60_000);
});
