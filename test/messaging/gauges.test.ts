/** Issue 16's gauges: what an operator watches, read from the tables and served on /metrics. */
import { Registry } from "prom-client";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { registerIdemGauges } from "../../app/observability.ts";
import { IdemGauges } from "../../src/messaging/gauges.ts";
import { Inbox } from "../../src/messaging/inbox.ts";
import type { Db } from "../../src/postgres/db.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { backends, type OpenDb } from "../helpers/db.ts";
import { prepare } from "./helpers.ts";

describe.each(backends)("gauges on $name", (backend) => {
  let open: OpenDb;
  let db: Db;
  beforeAll(async () => {
    open = await backend.open();
    db = open.db;
    await prepare(db);
  });
  afterAll(() => open?.close());

  it("read zero on empty tables", async () => {
    expect(await new IdemGauges(db).read()).toEqual({
      unfinishedKeys: {},
      oldestUnfinishedKeySeconds: 0,
      parkedOutboxEvents: 0,
      parkedInboxMessages: 0,
      relayLagSeconds: 0,
    });
  });

  it("count unfinished keys by recovery point, parked events and messages, and the relay's lag", async () => {
    const store = await PostgresStore.open(db);
    const bucket = store.partitions.bucketOf(Date.now());
    const key = (k: string, point: string, idleS: number) =>
      db.query(
        `INSERT INTO idem.keys (bucket, scope, key, fingerprint, created_at, recovery_point, updated_at)
         VALUES ($1, 's', $2, '\\x00', now(), $3, now() - $4::int * interval '1 second')`,
        [bucket, k, point, idleS],
      );
    await key("k1", "started", 5);
    await key("k2", "charged", 120);
    await key("k3", "charged", 10);
    await key("k4", "done", 900); // finished: not counted
    const ids: string[] = [];
    await db.transaction(async (tx) => {
      for (let i = 0; i < 3; i++) ids.push(await writeOutbox(tx, { topic: "t", type: "x", payload: { i } }));
    });
    await db.query("UPDATE idem.outbox SET created_at = now() - interval '90 seconds' WHERE id = $1", [
      ids[0],
    ]);
    await db.query(
      "UPDATE idem.outbox SET created_at = now() - interval '1 hour', parked_at = now() WHERE id = $1",
      [ids[1]],
    );
    const inbox = new Inbox(db, { consumer: "c", maxAttempts: 1 });
    const poison = { id: "p1", topic: "t", type: "x", body: "{}", headers: {}, redelivered: false };
    expect(
      await inbox.process(poison, async () => {
        throw new Error("poison");
      }),
    ).toBe("parked");

    const g = await new IdemGauges(db).read();
    expect(g.unfinishedKeys).toEqual({ started: 1, charged: 2 });
    expect(g.oldestUnfinishedKeySeconds).toBeGreaterThanOrEqual(119);
    expect(g.oldestUnfinishedKeySeconds).toBeLessThan(900);
    expect(g.parkedOutboxEvents).toBe(1);
    expect(g.parkedInboxMessages).toBe(1);
    expect(g.relayLagSeconds).toBeGreaterThanOrEqual(89); // the parked, older one aside
    expect(g.relayLagSeconds).toBeLessThan(3_600);

    const registry = new Registry();
    registerIdemGauges(registry, new IdemGauges(db));
    const text = await registry.metrics();
    expect(text).toMatch(/^idem_keys_unfinished\{recovery_point="charged"\} 2$/m);
    expect(text).toMatch(/^idem_keys_unfinished\{recovery_point="started"\} 1$/m);
    expect(text).toMatch(/^idem_outbox_parked 1$/m);
    expect(text).toMatch(/^idem_inbox_parked 1$/m);
    expect(text).toMatch(/^idem_relay_lag_seconds (9\d|\d{3,})(\.\d+)?$/m);
    expect(text).toMatch(/^idem_keys_unfinished_oldest_seconds \d+(\.\d+)?$/m);
  });
});
