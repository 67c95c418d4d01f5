/** The inbox: each message's effect applied once per consumer, whatever the deliveries. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Inbox, InboxResult } from "../../src/messaging/inbox.ts";
import type { Delivery } from "../../src/messaging/types.ts";
import type { Db, Tx } from "../../src/postgres/db.ts";
import { backends, type OpenDb, serverBackends } from "../helpers/db.ts";
import { balance, credit, prepare, unique } from "./helpers.ts";

/** A fresh wallet (and consumer name) per test, so the tests of one backend share a database. */
async function newWallet(db: Db): Promise<string> {
  const id = unique("w");
  await db.query("INSERT INTO wallets (id) VALUES ($1)", [id]);
  return id;
}

function delivery(id: string, cents: number, wallet: string, redelivered = false): Delivery {
  const body = JSON.stringify({ cents, wallet });
  return { id, topic: "topups", type: "wallet.topped-up", body, headers: {}, redelivered };
}

async function effects(db: Db, wallet: string): Promise<number> {
  const { rows } = await db.query<{ n: string }>(
    "SELECT count(*) AS n FROM effects e JOIN idem.inbox i ON i.message_id = e.message_id WHERE i.consumer = $1 AND i.status <> 'marker'",
    [wallet],
  );
  return Number(rows[0]!.n);
}

describe.each(backends)("inbox on $name", (backend) => {
  let open: OpenDb;
  let db: Db;
  beforeAll(async () => {
    open = await backend.open();
    db = open.db;
    await prepare(db);
  });
  afterAll(() => open?.close());

  it("applies the spec's five deliveries (evt-1, evt-2, evt-1, evt-2, evt-3) once each: balance 1000, not 1800", async () => {
    const wallet = await newWallet(db);
    const inbox = new Inbox(db, { consumer: wallet });
    const amounts: Record<string, number> = { "evt-1": 500, "evt-2": 300, "evt-3": 200 };
    const results: string[] = [];
    for (const id of ["evt-1", "evt-2", "evt-1", "evt-2", "evt-3"]) {
      results.push(await inbox.process(delivery(id, amounts[id]!, wallet), credit));
    }
    expect(results).toEqual(["applied", "applied", "duplicate", "duplicate", "applied"]);
    expect(await balance(db, wallet)).toBe(1000);
    expect(await effects(db, wallet)).toBe(3);
  });

  it("applies a batch in one transaction; a poison message in it is retried and parked alone, the others applied once", async () => {
    const wallet = await newWallet(db);
    const inbox = new Inbox(db, { consumer: wallet, maxAttempts: 2 });
    const batch = ["b-1", "b-2", "poison", "b-3"].map((id) => delivery(id, 100, wallet));
    const effect = async (tx: Tx, m: Delivery) => {
      if (m.id === "poison") throw new Error("cannot apply this one");
      await credit(tx, m);
    };
    // The whole batch rolls back with the poison message, then each is processed on its own.
    expect(await inbox.processBatch(batch, effect)).toEqual(["applied", "applied", "retry", "applied"]);
    expect(await balance(db, wallet)).toBe(300);
    // Redelivered with the poison message: the committed ones are duplicates, the poison one parks.
    const again = batch.map((d) => ({ ...d, redelivered: true }));
    expect(await inbox.processBatch(again, effect)).toEqual([
      "duplicate",
      "duplicate",
      "parked",
      "duplicate",
    ]);
    expect(await balance(db, wallet)).toBe(300);
    expect(await effects(db, wallet)).toBe(3);
    expect((await inbox.parked()).map((p) => p.messageId)).toEqual(["poison"]);
  });

  it("applies the same message once per consumer: two consumers each apply it once", async () => {
    const wallet = await newWallet(db);
    const a = new Inbox(db, { consumer: `${wallet}-a` });
    const b = new Inbox(db, { consumer: `${wallet}-b` });
    for (const inbox of [a, b, a, b]) await inbox.process(delivery("evt-1", 100, wallet), credit);
    expect(await balance(db, wallet)).toBe(200);
  });

  it("rolls a failed effect back with its mark, retries it, and parks it with its error after maxAttempts", async () => {
    const wallet = await newWallet(db);
    const inbox = new Inbox(db, { consumer: wallet, maxAttempts: 3 });
    let calls = 0;
    const failing = async (tx: Tx, m: Delivery) => {
      calls++;
      await credit(tx, m); // written, then rolled back with the throw
      throw new Error("receipt template missing");
    };
    const d = delivery("poison", 700, wallet);
    expect(await inbox.process(d, failing)).toBe(InboxResult.retry);
    expect(await inbox.process({ ...d, redelivered: true }, failing)).toBe(InboxResult.retry);
    expect(await inbox.process({ ...d, redelivered: true }, failing)).toBe(InboxResult.parked);
    // Later copies are acked and skipped: the handler is not called again.
    expect(await inbox.process({ ...d, redelivered: true }, failing)).toBe(InboxResult.duplicate);
    expect(calls).toBe(3);
    expect(await balance(db, wallet)).toBe(0);
    const parked = await inbox.parked();
    expect(parked).toHaveLength(1);
    expect(parked[0]).toMatchObject({
      messageId: "poison",
      attempts: 3,
      lastError: "receipt template missing",
    });
    expect(JSON.parse(parked[0]!.body)).toEqual({ cents: 700, wallet });
    // Unparked, the next delivery is processed again (now with a working handler).
    expect(await inbox.unpark("poison")).toBe(true);
    expect(await inbox.process({ ...d, redelivered: true }, credit)).toBe(InboxResult.applied);
    expect(await balance(db, wallet)).toBe(700);
  });

  it("succeeds after a transient failure and forgets the failed attempt", async () => {
    const wallet = await newWallet(db);
    const inbox = new Inbox(db, { consumer: wallet, maxAttempts: 2 });
    let first = true;
    const flaky = async (tx: Tx, m: Delivery) => {
      if (first) {
        first = false;
        throw new Error("deadlock detected");
      }
      await credit(tx, m);
    };
    expect(await inbox.process(delivery("e", 5, wallet), flaky)).toBe("retry");
    expect(await inbox.process(delivery("e", 5, wallet, true), flaky)).toBe("applied");
    const { rows } = await db.query("SELECT * FROM idem.inbox_attempts WHERE consumer = $1", [wallet]);
    expect(rows).toHaveLength(0);
    expect(await balance(db, wallet)).toBe(5);
  });
});

describe.each(serverBackends)("inbox under concurrency on $name", (backend) => {
  it("applies a message once when 20 copies arrive at the same moment", async () => {
    const { db, close } = await backend.open();
    try {
      await prepare(db);
      const inbox = new Inbox(db, { consumer: "c" });
      const slow = async (tx: Tx, m: Delivery) => {
        await credit(tx, m);
        await tx.query("SELECT pg_sleep(0.05)");
      };
      const copies = Array.from({ length: 20 }, () => inbox.process(delivery("same", 10, "w1"), slow));
      const results = await Promise.all(copies);
      expect(results.filter((r) => r === "applied")).toHaveLength(1);
      expect(results.filter((r) => r === "duplicate")).toHaveLength(19);
      expect(await balance(db)).toBe(10);
    } finally {
      await close();
    }
  });
});
