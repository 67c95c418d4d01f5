/**
 * The outbox relay batch by batch (`runOnce`): what a claim takes and hands over, how publishes are
 * marked, backed off, parked and put back, per-aggregate chains, leases after a crash, and the loop's
 * waking and cleanup. Small batches, so that `npm run mutate` can run it once per mutant.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Inbox } from "../../src/messaging/inbox.ts";
import { Relay, type RelayOptions } from "../../src/messaging/relay.ts";
import {
  BrokerUnavailableError,
  type OutboxMessage,
  type Publisher,
  type PublishOutcome,
} from "../../src/messaging/types.ts";
import type { Db } from "../../src/postgres/db.ts";
import type { Listen } from "../../src/postgres/drivers/listen.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { backends, type OpenDb } from "../helpers/db.ts";
import { prepare, unique, until } from "./helpers.ts";

type Verdict = PublishOutcome | "unavailable";

/** A publisher that records every call (one per event of an aggregate when ordered); `verdict` decides per message. */
function recorder(verdict: (m: OutboxMessage) => Verdict = () => ({ ok: true })) {
  const calls: OutboxMessage[][] = [];
  const publisher: Publisher = {
    name: "recorder",
    async publish(batch) {
      calls.push([...batch]);
      const outcomes: PublishOutcome[] = [];
      for (const m of batch) {
        const v = verdict(m);
        if (v === "unavailable") throw new BrokerUnavailableError("broker down");
        outcomes.push(v);
      }
      return outcomes;
    },
    async close() {},
  };
  return { publisher, calls, ids: () => calls.flat().map((m) => m.id) };
}

const fail = (message: string, name?: string): PublishOutcome => {
  const error = new Error(message);
  if (name) error.name = name;
  return { ok: false, error };
};

interface OutboxRow {
  id: string;
  published: boolean;
  parked: boolean;
  attempts: number;
  last_error: string | null;
  locked: boolean;
  /** ms from now until the row may be claimed again (negative or null: now). */
  wait_ms: number | null;
}

async function rowsOf(db: Db, topic: string): Promise<OutboxRow[]> {
  const { rows } = await db.query<OutboxRow>(
    `SELECT id::text, published_at IS NOT NULL AS published, parked_at IS NOT NULL AS parked, attempts,
            last_error, locked_until > now() AS locked,
            (extract(epoch FROM locked_until - now()) * 1000)::float8 AS wait_ms
       FROM idem.outbox WHERE topic = $1 ORDER BY id`,
    [topic],
  );
  return rows.map((r) => ({
    ...r,
    attempts: Number(r.attempts),
    wait_ms: r.wait_ms === null ? null : Number(r.wait_ms),
    locked: r.locked === true,
  }));
}

/** The passing of time for rows backing off or leased: they may be claimed now. */
async function expireLocks(db: Db, topic: string): Promise<void> {
  await db.query(
    "UPDATE idem.outbox SET locked_until = now() - interval '1 second' WHERE topic = $1 AND locked_until IS NOT NULL",
    [topic],
  );
}

async function write(
  db: Db,
  topic: string,
  events: { aggregate?: [string | undefined, string]; payload?: unknown; headers?: Record<string, string> }[],
): Promise<string[]> {
  const ids: string[] = [];
  for (const e of events) {
    // One transaction each: ids (UUIDv7) are in write order.
    ids.push(
      await db.transaction((tx) =>
        writeOutbox(tx, {
          topic,
          type: "thing.happened",
          payload: e.payload ?? { n: ids.length },
          headers: e.headers,
          aggregateType: e.aggregate?.[0],
          aggregateId: e.aggregate?.[1],
        }),
      ),
    );
  }
  return ids;
}

const n = (count: number) => Array.from({ length: count }, () => ({}));

describe.each(backends)("relay batches on $name", (backend) => {
  let open: OpenDb;
  let db: Db;
  const relay = (topic: string, publisher: Publisher, o: Partial<RelayOptions> = {}) =>
    new Relay({ db, publisher, topics: [topic], pollMs: 10_000, ...o });

  beforeAll(async () => {
    open = await backend.open();
    db = open.db;
    await prepare(db);
  });
  afterAll(() => open?.close());

  it("claims at most batchSize events of its topics, hands each over whole, marks them published", async () => {
    const topic = unique("t");
    const other = unique("other");
    const before = Date.now();
    const [first, second, third] = await write(db, topic, [
      { aggregate: ["order", "o1"], payload: { cents: 5 }, headers: { trace: "abc" } },
      {},
      {},
    ]);
    await write(db, other, n(1));
    const r = recorder();
    const relay1 = relay(topic, r.publisher, { batchSize: 2 });

    expect(await relay1.runOnce()).toBe(2);
    expect(r.calls).toHaveLength(1);
    const [m1, m2] = r.calls[0]!;
    expect(m1).toMatchObject({
      id: first,
      topic,
      type: "thing.happened",
      headers: { trace: "abc" },
      aggregateType: "order",
      aggregateId: "o1",
      attempts: 0,
    });
    expect(JSON.parse(m1!.body)).toEqual({ cents: 5 });
    expect(m1!.createdAt).toBeInstanceOf(Date);
    expect(Math.abs(m1!.createdAt.getTime() - before)).toBeLessThan(60_000);
    expect(m2).toMatchObject({ id: second, headers: {}, aggregateType: null, aggregateId: null });

    expect(await relay1.runOnce()).toBe(1);
    expect(r.ids()).toEqual([first, second, third]);
    expect(await relay1.runOnce()).toBe(0);
    expect((await rowsOf(db, topic)).map((x) => [x.published, x.locked, x.last_error])).toEqual([
      [true, false, null],
      [true, false, null],
      [true, false, null],
    ]);
    expect((await rowsOf(db, other))[0]!.published).toBe(false);
    expect(relay1.stats).toMatchObject({ batches: 2, published: 3, failed: 0, duplicates: 0 });
  });

  it("without a topic list it takes every topic's events", async () => {
    const topic = unique("t");
    await write(db, topic, n(2));
    const r = recorder();
    const all = new Relay({ db, publisher: r.publisher, batchSize: 10_000 });
    while ((await all.runOnce()) > 0) {}
    expect((await rowsOf(db, topic)).every((x) => x.published)).toBe(true);
  });

  it("publishes an event whose headers are JSON null with no headers", async () => {
    const topic = unique("t");
    const [id] = await write(db, topic, n(1));
    await db.query("UPDATE idem.outbox SET headers = 'null'::jsonb WHERE id = $1::uuid", [id]);
    const r = recorder();
    await relay(topic, r.publisher).runOnce();
    expect(r.calls[0]![0]!.headers).toEqual({});
  });

  it("counts an event the broker already had as published, and as a duplicate", async () => {
    const topic = unique("t");
    await write(db, topic, n(2));
    let k = 0;
    const r = recorder(() => ({ ok: true, duplicate: k++ === 0 }));
    const relay1 = relay(topic, r.publisher);
    await relay1.runOnce();
    expect(relay1.stats).toMatchObject({ published: 2, duplicates: 1 });
    expect((await rowsOf(db, topic)).every((x) => x.published)).toBe(true);
  });

  it("a claimed batch is left alone by other relays until its lease ends", async () => {
    const topic = unique("t");
    await write(db, topic, n(2));
    // A publisher that never answers: the batch stays claimed, unmarked.
    let release!: () => void;
    const hang: Publisher = {
      name: "hang",
      publish: (batch) =>
        new Promise((resolve) => {
          release = () => resolve(batch.map(() => ({ ok: true })));
        }),
      close: async () => {},
    };
    const slow = relay(topic, hang, { leaseMs: 60_000 });
    const running = slow.runOnce();
    await until(() => release !== undefined, 5_000, "the slow relay's publish");
    const r = recorder();
    expect(await relay(topic, r.publisher).runOnce()).toBe(0);
    const rows = await rowsOf(db, topic);
    expect(rows.every((x) => x.locked && x.wait_ms! > 50_000 && x.wait_ms! <= 60_000)).toBe(true);
    release();
    expect(await running).toBe(2);
    expect((await rowsOf(db, topic)).every((x) => x.published && !x.locked)).toBe(true);
  });

  it("a relay killed after publishing leaves its batch leased; once the lease ends it is sent again and the inbox drops the copy", async () => {
    const topic = unique("t");
    const ids = await write(db, topic, n(2));
    const r = recorder();
    const doomed = relay(topic, r.publisher, { leaseMs: 200, crash: (p) => p === "after-publish" });
    await expect(doomed.runOnce()).rejects.toThrow("after-publish");
    expect(r.ids()).toEqual(ids);
    expect((await rowsOf(db, topic)).every((x) => !x.published && x.locked)).toBe(true);

    const survivor = relay(topic, r.publisher, { leaseMs: 200 });
    expect(await survivor.runOnce()).toBe(0); // still leased
    await until(async () => (await survivor.runOnce()) > 0, 5_000, "the lease to end");
    expect(r.ids()).toEqual([...ids, ...ids]);
    expect((await rowsOf(db, topic)).every((x) => x.published)).toBe(true);

    const inbox = new Inbox(db, { consumer: unique("c") });
    const results: string[] = [];
    for (const m of r.calls.flat()) {
      results.push(
        await inbox.process({ ...m, redelivered: false }, async (tx, d) => {
          await tx.query("INSERT INTO effects (message_id) VALUES ($1)", [d.id]);
        }),
      );
    }
    expect(results).toEqual(["applied", "applied", "duplicate", "duplicate"]);
    const { rows } = await db.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM effects WHERE message_id = ANY(string_to_array($1, ','))",
      [ids.join(",")],
    );
    expect(rows[0]!.n).toBe(2);
  });

  it("a relay killed right after its claim publishes nothing; the next relay publishes it all once the lease ends", async () => {
    const topic = unique("t");
    const ids = await write(db, topic, n(2));
    const r = recorder();
    const doomed = relay(topic, r.publisher, { leaseMs: 100, crash: (p) => p === "after-claim" });
    await expect(doomed.runOnce()).rejects.toThrow("after-claim");
    expect(r.calls).toHaveLength(0);
    expect(doomed.stats.batches).toBe(0);
    const survivor = relay(topic, r.publisher, { leaseMs: 100 });
    await until(async () => (await survivor.runOnce()) > 0, 5_000, "the lease to end");
    expect(r.ids()).toEqual(ids);
  });

  it("a failed publish counts an attempt, keeps the error, backs off (50-100% of base * 2^attempts, capped), parks at maxAttempts", async () => {
    const topic = unique("t");
    const [bad, good] = await write(db, topic, n(2));
    const errors: string[] = [];
    const r = recorder((m) => (m.id === bad ? fail("card service said no") : { ok: true }));
    const relay1 = relay(topic, r.publisher, {
      maxAttempts: 3,
      backoff: { baseMs: 100_000, capMs: 150_000 },
      onError: (e) => errors.push(e.message),
    });

    expect(await relay1.runOnce()).toBe(2);
    let [b, g] = await rowsOf(db, topic);
    expect(g).toMatchObject({ id: good, published: true, attempts: 0 });
    expect(b).toMatchObject({
      id: bad,
      published: false,
      parked: false,
      attempts: 1,
      last_error: "card service said no",
    });
    expect(b!.wait_ms).toBeGreaterThan(45_000);
    expect(b!.wait_ms).toBeLessThanOrEqual(100_000);
    expect(relay1.stats).toMatchObject({ published: 1, failed: 1, parked: 0 });
    expect(errors).toEqual(["publishing 1 event(s) failed: card service said no"]);
    expect(await relay1.runOnce()).toBe(0); // backing off

    await expireLocks(db, topic);
    expect(await relay1.runOnce()).toBe(1);
    expect(r.calls[1]![0]).toMatchObject({ id: bad, attempts: 1 });
    [b] = await rowsOf(db, topic);
    expect(b).toMatchObject({ attempts: 2, parked: false });
    // 100 s * 2^1 is capped at 150 s.
    expect(b!.wait_ms).toBeGreaterThan(70_000);
    expect(b!.wait_ms).toBeLessThanOrEqual(150_000);

    await expireLocks(db, topic);
    expect(await relay1.runOnce()).toBe(1);
    [b] = await rowsOf(db, topic);
    expect(b).toMatchObject({
      attempts: 3,
      parked: true,
      published: false,
      last_error: "card service said no",
    });
    expect(relay1.stats).toMatchObject({ failed: 3, parked: 1 });
    await expireLocks(db, topic);
    expect(await relay1.runOnce()).toBe(0); // parked: left alone
  });

  it("reports failures grouped by error, names an error without a message by its name, cuts long messages", async () => {
    const topic = unique("t");
    const [a, b, c, d] = await write(db, topic, n(4));
    const long = "x".repeat(2_500);
    const errors: string[] = [];
    const r = recorder((m) =>
      m.id === a || m.id === b ? fail("timeout") : m.id === c ? fail("", "TlsError") : fail(long),
    );
    const relay1 = relay(topic, r.publisher, { onError: (e) => errors.push(e.message) });
    await relay1.runOnce();
    expect(errors.map((e) => e.slice(0, 60))).toEqual([
      "publishing 2 event(s) failed: timeout",
      "publishing 1 event(s) failed: TlsError",
      `publishing 1 event(s) failed: ${"x".repeat(30)}`,
    ]);
    const rows = await rowsOf(db, topic);
    expect(rows.map((x) => x.last_error?.slice(0, 10))).toEqual([
      "timeout",
      "timeout",
      "TlsError",
      "xxxxxxxxxx",
    ]);
    expect(rows.find((x) => x.id === d)!.last_error).toHaveLength(2_000);
    expect(relay1.stats.failed).toBe(4);
  });

  it("a publisher that throws, or answers for fewer messages than it was given, fails the whole batch", async () => {
    const topic = unique("t");
    await write(db, topic, n(2));
    const short: Publisher = { name: "short", publish: async () => [{ ok: true }], close: async () => {} };
    await relay(topic, short).runOnce();
    let rows = await rowsOf(db, topic);
    expect(rows.map((x) => [x.published, x.attempts, x.last_error])).toEqual([
      [false, 1, "publisher short answered 1 of 2"],
      [false, 1, "publisher short answered 1 of 2"],
    ]);

    await expireLocks(db, topic);
    const throws: Publisher = {
      name: "throws",
      publish: async () => {
        throw new Error("socket hang up");
      },
      close: async () => {},
    };
    await relay(topic, throws).runOnce();
    rows = await rowsOf(db, topic);
    expect(rows.map((x) => [x.published, x.attempts, x.last_error])).toEqual([
      [false, 2, "socket hang up"],
      [false, 2, "socket hang up"],
    ]);
  });

  it("puts a batch back at once, counting no attempt, while the broker is unreachable", async () => {
    const topic = unique("t");
    await write(db, topic, n(3));
    let down = true;
    const errors: Error[] = [];
    const r = recorder(() => (down ? "unavailable" : { ok: true }));
    const relay1 = relay(topic, r.publisher, { maxAttempts: 1, onError: (e) => errors.push(e) });
    expect(await relay1.runOnce()).toBe(3);
    const rows = await rowsOf(db, topic);
    expect(rows.map((x) => [x.published, x.parked, x.attempts, x.locked, x.last_error])).toEqual([
      [false, false, 0, false, "broker down"],
      [false, false, 0, false, "broker down"],
      [false, false, 0, false, "broker down"],
    ]);
    expect(relay1.stats).toMatchObject({ unavailable: 1, failed: 0, published: 0 });
    expect(errors[0]).toBeInstanceOf(BrokerUnavailableError);
    down = false;
    expect(await relay1.runOnce()).toBe(3);
    expect((await rowsOf(db, topic)).every((x) => x.published)).toBe(true);
  });

  describe("with orderByAggregate", () => {
    const ordered = (topic: string, publisher: Publisher, o: Partial<RelayOptions> = {}) =>
      relay(topic, publisher, { orderByAggregate: true, ...o });

    /** A publisher whose every call waits until the test confirms its messages (or fails them). */
    function gated() {
      const calls: string[][] = [];
      const waiting = new Map<string, (o: PublishOutcome) => void>();
      const publisher: Publisher = {
        name: "gated",
        publish: (batch) => {
          calls.push(batch.map((m) => m.id));
          return Promise.all(batch.map((m) => new Promise<PublishOutcome>((r) => waiting.set(m.id, r))));
        },
        close: async () => {},
      };
      const answer = async (id: string | undefined, o: PublishOutcome = { ok: true }) => {
        await until(() => waiting.has(id!), 3_000, `a publish of ${id}`);
        waiting.get(id!)!(o);
        waiting.delete(id!);
      };
      return { publisher, calls, answer, sent: (id: string | undefined) => calls.flat().includes(id!) };
    }

    it("sends each aggregate's next event once its previous one is confirmed; aggregates never wait for each other", async () => {
      const topic = unique("t");
      const [A, B] = [unique("A"), unique("B")];
      const [a1, b1, a2, x1, c1, a3] = await write(db, topic, [
        { aggregate: ["order", A] },
        { aggregate: ["order", B] },
        { aggregate: ["order", A] },
        {},
        { aggregate: ["invoice", A] }, // same id, another type: another aggregate
        { aggregate: ["order", A] },
      ]);
      const g = gated();
      const running = ordered(topic, g.publisher).runOnce();
      // At once: the events without an aggregate together, and the first event of each aggregate.
      await until(() => g.calls.length === 4, 3_000, "the first calls");
      expect(g.calls).toEqual([[x1], [a1], [b1], [c1]]);
      await g.answer(a1);
      await until(() => g.sent(a2), 3_000, "a2 once a1 is confirmed");
      await g.answer(a2);
      await until(() => g.sent(a3), 3_000, "a3 once a2 is confirmed");
      // b1 and c1 are still unconfirmed: order A went on without them.
      await g.answer(a3);
      for (const id of [x1, b1, c1]) await g.answer(id);
      expect(await running).toBe(6);
      expect(g.calls).toEqual([[x1], [a1], [b1], [c1], [a2], [a3]]);
      expect((await rowsOf(db, topic)).every((x) => x.published)).toBe(true);

      // Without ordering, one call.
      const topic2 = unique("t");
      await write(db, topic2, [{ aggregate: ["order", A] }, { aggregate: ["order", A] }]);
      const r2 = recorder();
      await relay(topic2, r2.publisher).runOnce();
      expect(r2.calls).toHaveLength(1);
    });

    it("a failed event holds back the later events of its aggregate until it is published", async () => {
      const topic = unique("t");
      const [A, B] = [unique("A"), unique("B")];
      const [a1, b1, a2, b2, a3] = await write(db, topic, [
        { aggregate: ["order", A] },
        { aggregate: ["order", B] },
        { aggregate: ["order", A] },
        { aggregate: ["order", B] },
        { aggregate: ["order", A] },
      ]);
      let broken = true;
      const r = recorder((m) => (broken && m.id === a1 ? fail("nope") : { ok: true }));
      const relay1 = ordered(topic, r.publisher, { backoff: { baseMs: 100_000, capMs: 100_000 } });
      expect(await relay1.runOnce()).toBe(5);
      expect(r.calls.map((w) => w.map((m) => m.id))).toEqual([[a1], [b1], [b2]]);
      let rows = await rowsOf(db, topic);
      const state = (id: string | undefined) => rows.find((x) => x.id === id)!;
      expect(state(a1)).toMatchObject({ published: false, attempts: 1, locked: true });
      // Put back untouched: no attempt, no error, not locked, but held behind a1.
      for (const id of [a2, a3]) {
        expect(state(id)).toMatchObject({ published: false, attempts: 0, last_error: null, locked: false });
      }
      expect(state(b2).published).toBe(true);
      expect(await relay1.runOnce()).toBe(0);

      broken = false;
      await expireLocks(db, topic);
      expect(await relay1.runOnce()).toBe(3);
      expect(r.calls.slice(3).map((w) => w.map((m) => m.id))).toEqual([[a1], [a2], [a3]]);
      rows = await rowsOf(db, topic);
      expect(rows.every((x) => x.published)).toBe(true);
    });

    it("a broker outage mid-batch puts back the event in hand and every later one", async () => {
      const topic = unique("t");
      const A = unique("A");
      const [a1, a2, a3] = await write(db, topic, [
        { aggregate: ["order", A] },
        { aggregate: ["order", A] },
        { aggregate: ["order", A] },
      ]);
      let calls = 0;
      const flaky: Publisher = {
        name: "flaky",
        publish: async (batch) => {
          if (++calls === 2) throw new BrokerUnavailableError("gone");
          return batch.map(() => ({ ok: true }));
        },
        close: async () => {},
      };
      const relay1 = ordered(topic, flaky);
      expect(await relay1.runOnce()).toBe(3);
      const rows = await rowsOf(db, topic);
      expect(rows.map((x) => [x.id, x.published, x.locked, x.attempts, x.last_error])).toEqual([
        [a1, true, false, 0, null],
        [a2, false, false, 0, "gone"],
        [a3, false, false, 0, "gone"],
      ]);
      expect(relay1.stats.unavailable).toBe(1);
      expect(await relay1.runOnce()).toBe(2);
      expect((await rowsOf(db, topic)).every((x) => x.published)).toBe(true);
    });

    it("a broker outage puts back the events held behind a failure too", async () => {
      const topic = unique("t");
      const [A, B] = [unique("A"), unique("B")];
      const [a1, b1, a2, b2] = await write(db, topic, [
        { aggregate: ["order", A] },
        { aggregate: ["order", B] },
        { aggregate: ["order", A] },
        { aggregate: ["order", B] },
      ]);
      const r = recorder((m) => (m.id === a1 ? fail("nope") : m.id === b2 ? "unavailable" : { ok: true }));
      const relay1 = ordered(topic, r.publisher, { backoff: { baseMs: 100_000, capMs: 100_000 } });
      expect(await relay1.runOnce()).toBe(4);
      const rows = await rowsOf(db, topic);
      const state = (id: string | undefined) => rows.find((x) => x.id === id)!;
      expect(state(a1)).toMatchObject({ attempts: 1, locked: true });
      expect(state(b1).published).toBe(true);
      expect(state(a2)).toMatchObject({ published: false, locked: false, last_error: null });
      expect(state(b2)).toMatchObject({ published: false, locked: false, last_error: "broker down" });
    });

    it("a broker outage puts back every event held behind failures, of several aggregates", async () => {
      const topic = unique("t");
      // Aggregates of their own: an aggregate held in another test's topic is held here too.
      const [A, B, C] = [unique("A"), unique("B"), unique("C")];
      const [a1, c1, b1, a2, c2, b2] = await write(db, topic, [
        { aggregate: ["order", A] },
        { aggregate: ["order", C] },
        { aggregate: ["order", B] },
        { aggregate: ["order", A] },
        { aggregate: ["order", C] },
        { aggregate: ["order", B] },
      ]);
      const r = recorder((m) => {
        if (m.id === a1 || m.id === c1) return fail("nope");
        return m.id === b2 ? "unavailable" : { ok: true };
      });
      const relay1 = ordered(topic, r.publisher, { backoff: { baseMs: 100_000, capMs: 100_000 } });
      expect(await relay1.runOnce()).toBe(6);
      const rows = await rowsOf(db, topic);
      const state = (id: string | undefined) => rows.find((x) => x.id === id)!;
      for (const id of [a1, c1]) expect(state(id)).toMatchObject({ attempts: 1, locked: true });
      expect(state(b1).published).toBe(true);
      for (const id of [a2, c2]) {
        expect(state(id)).toMatchObject({ published: false, locked: false, attempts: 0, last_error: null });
      }
      expect(state(b2)).toMatchObject({ published: false, locked: false, last_error: "broker down" });
    });

    it("events without an aggregate go out together at once; a failed one holds back no aggregate", async () => {
      const topic = unique("t");
      // An aggregate id "null" without a type is an aggregate like any other, not "no aggregate".
      const N = unique("null");
      const [x1, n1, x2, n2] = await write(db, topic, [
        {},
        { aggregate: [undefined, N] },
        {},
        { aggregate: [undefined, N] },
      ]);
      const r = recorder((m) => (m.id === x1 ? fail("nope") : { ok: true }));
      expect(await ordered(topic, r.publisher).runOnce()).toBe(4);
      expect(r.calls.map((w) => w.map((m) => m.id))).toEqual([[x1, x2], [n1], [n2]]);
      const rows = await rowsOf(db, topic);
      expect(rows.map((x) => [x.id, x.published])).toEqual([
        [x1, false],
        [n1, true],
        [x2, true],
        [n2, true],
      ]);
    });

    it("a message the broker lost counts no attempt, holds its aggregate back, and goes out again within a second", async () => {
      const topic = unique("t");
      const [A, B] = [unique("A"), unique("B")];
      const [a1, b1, a2] = await write(db, topic, [
        { aggregate: ["order", A] },
        { aggregate: ["order", B] },
        { aggregate: ["order", A] },
      ]);
      let lose = true;
      const errors: Error[] = [];
      const r = recorder((m) =>
        lose && m.id === a1
          ? { ok: false, error: new BrokerUnavailableError("connection lost") }
          : { ok: true },
      );
      const relay1 = ordered(topic, r.publisher, { maxAttempts: 1, onError: (e) => errors.push(e) });
      expect(await relay1.runOnce()).toBe(3);
      let rows = await rowsOf(db, topic);
      const state = (id: string | undefined) => rows.find((x) => x.id === id)!;
      expect(state(a1)).toMatchObject({ published: false, parked: false, attempts: 0, locked: true });
      expect(state(a1).last_error).toBe("connection lost");
      expect(state(a1).wait_ms).toBeLessThanOrEqual(250);
      expect(state(a2)).toMatchObject({ published: false, attempts: 0, locked: false });
      expect(state(b1).published).toBe(true);
      expect(relay1.stats).toMatchObject({ unavailable: 1, failed: 0, parked: 0, published: 1 });
      expect(errors[0]).toBeInstanceOf(BrokerUnavailableError);
      expect(await relay1.runOnce()).toBe(0); // a2 waits behind a1

      lose = false;
      await expireLocks(db, topic);
      expect(await relay1.runOnce()).toBe(2);
      rows = await rowsOf(db, topic);
      expect(rows.every((x) => x.published)).toBe(true);
    });
  });

  describe("waking when a wait ends", () => {
    it("a failed event is retried when its backoff ends, not at the next poll, and its aggregate goes on", async () => {
      const topic = unique("t");
      const A = unique("A");
      const [a1, a2] = await write(db, topic, [{ aggregate: ["order", A] }, { aggregate: ["order", A] }]);
      let failures = 1;
      const r = recorder((m) => (m.id === a1 && failures-- > 0 ? fail("nope") : { ok: true }));
      const relay1 = relay(topic, r.publisher, {
        orderByAggregate: true,
        pollMs: 600_000,
        backoff: { baseMs: 300, capMs: 300 },
      });
      const t0 = Date.now();
      await relay1.start();
      try {
        await until(() => r.ids().includes(a2!), 30_000, "a2, after a1's retry");
      } finally {
        await relay1.stop();
      }
      // The backoff is 150-300 ms; the poll, ten minutes.
      expect(Date.now() - t0).toBeLessThan(30_000);
      expect(r.ids()).toEqual([a1, a1, a2]);
    });

    it("a message the broker lost goes out again within a second, without a poll or a wake-up", async () => {
      const topic = unique("t");
      const [id] = await write(db, topic, n(1));
      let lose = 1;
      const r = recorder(() =>
        lose-- > 0 ? { ok: false, error: new BrokerUnavailableError("no ack in time") } : { ok: true },
      );
      const relay1 = relay(topic, r.publisher, { pollMs: 600_000 });
      await relay1.start();
      try {
        await until(async () => (await rowsOf(db, topic))[0]!.published, 30_000, "the second try");
      } finally {
        await relay1.stop();
      }
      expect(r.ids()).toEqual([id, id]);
      expect((await rowsOf(db, topic))[0]).toMatchObject({ attempts: 0, published: true });
    });

    it("with several loops, a loop that found nothing takes an aggregate's next events once another published its first", async () => {
      const topic = unique("t");
      const A = unique("A");
      const ids = await write(db, topic, [{ aggregate: ["order", A] }, { aggregate: ["order", A] }]);
      const r = recorder();
      // batchSize 1: each claim takes one event; the second is claimable only once the first is published.
      const relay1 = relay(topic, r.publisher, {
        orderByAggregate: true,
        batchSize: 1,
        concurrency: 2,
        pollMs: 600_000,
      });
      await relay1.start();
      try {
        await until(async () => (await rowsOf(db, topic)).every((x) => x.published), 30_000, "both events");
      } finally {
        await relay1.stop();
      }
      expect(r.ids()).toEqual(ids);
    });
  });

  it("a database failure while marking a batch is thrown; the rows stay leased, to be sent again", async () => {
    const topic = unique("t");
    await write(db, topic, n(2));
    const broken = new Error("disk full");
    const failing: Db = new Proxy(db, {
      get(target, prop, receiver) {
        if (prop === "query") {
          return (sql: string, params?: unknown[]) =>
            sql.includes("SET published_at = now()") ? Promise.reject(broken) : target.query(sql, params);
        }
        return Reflect.get(target, prop, receiver);
      },
    });
    const r = recorder();
    const relay1 = new Relay({ db: failing, publisher: r.publisher, topics: [topic] });
    await expect(relay1.runOnce()).rejects.toBe(broken);
    expect(r.calls).toHaveLength(1);
    expect((await rowsOf(db, topic)).map((x) => [x.published, x.locked])).toEqual([
      [false, true],
      [false, true],
    ]);
  });

  it("refuses options that are not positive numbers", () => {
    const r = recorder();
    for (const bad of [
      { batchSize: 0 },
      { batchSize: Number.NaN },
      { batchSize: Number.POSITIVE_INFINITY },
      { concurrency: 0 },
      { leaseMs: -1 },
      { maxAttempts: 0 },
      { pollMs: 0 },
      { cleanupEveryMs: 0 },
    ]) {
      expect(() => new Relay({ db, publisher: r.publisher, ...bad }), JSON.stringify(bad)).toThrow(
        RangeError,
      );
    }
    expect(() => new Relay({ db, publisher: r.publisher, batchSize: 1, pollMs: 1 })).not.toThrow();
    // The message names the option and the value.
    for (const [bad, message] of [
      [{ batchSize: 0 }, "batchSize must be a positive number, got 0"],
      [{ concurrency: -2 }, "concurrency must be a positive number, got -2"],
      [{ leaseMs: 0 }, "leaseMs must be a positive number, got 0"],
      [{ maxAttempts: Number.NaN }, "maxAttempts must be a positive number, got NaN"],
      [{ pollMs: -1 }, "pollMs must be a positive number, got -1"],
      [{ cleanupEveryMs: 0 }, "cleanupEveryMs must be a positive number, got 0"],
    ] as const) {
      expect(() => new Relay({ db, publisher: r.publisher, ...bad })).toThrow(message);
    }
  });

  it("deletes published rows past retention, more than one chunk of them, and keeps everything with retention 0", async () => {
    const topic = unique("t");
    await db.query(
      `INSERT INTO idem.outbox (id, topic, type, payload, published_at)
       SELECT gen_random_uuid(), $1, 'old', '{}'::jsonb, now() - interval '3 hours' FROM generate_series(1, 5001)`,
      [topic],
    );
    await write(db, topic, n(1)); // unpublished: kept
    const keep = relay(topic, recorder().publisher, { retentionMs: 0 });
    expect(await keep.cleanup()).toBe(0);
    const sweep = relay(topic, recorder().publisher, { retentionMs: 3_600_000 });
    expect(await sweep.cleanup()).toBe(5_001);
    expect(sweep.stats.deleted).toBe(5_001);
    expect(await rowsOf(db, topic)).toHaveLength(1);
  });

  describe("running", () => {
    it("an idle relay wakes on wake() and on a notification, and stop() ends its sleep", async () => {
      const topic = unique("t");
      let notify: (() => void) | undefined;
      let channel = "";
      let closed = false;
      const listen: Listen = async (ch, onNotify) => {
        channel = ch;
        notify = onNotify;
        return {
          close: async () => {
            closed = true;
          },
        };
      };
      const r = recorder();
      const relay1 = relay(topic, r.publisher, { pollMs: 60_000, listen });
      await relay1.start();
      expect(relay1.running).toBe(true);
      expect(channel).toBe("idem_outbox");
      try {
        await new Promise((res) => setTimeout(res, 50)); // the first claim found nothing: asleep
        const [one] = await write(db, topic, n(1));
        relay1.wake();
        await until(() => r.ids().includes(one!), 3_000, "the woken relay to publish");
        await new Promise((res) => setTimeout(res, 50));
        const [two] = await write(db, topic, n(1));
        notify!();
        await until(() => r.ids().includes(two!), 3_000, "the notified relay to publish");
      } finally {
        const t0 = Date.now();
        await relay1.stop();
        expect(Date.now() - t0).toBeLessThan(5_000);
      }
      expect(relay1.running).toBe(false);
      expect(closed).toBe(true);
    });

    it("a wake-up that comes between a claim that found nothing and the sleep is not lost", async () => {
      const topic = unique("t");
      let late: string | undefined;
      let relay1!: Relay;
      // The event commits (and is announced) just after the claim that missed it, before the loop sleeps.
      const racy: Db = new Proxy(db, {
        get(target, prop, receiver) {
          if (prop === "query") {
            return async (sql: string, params?: unknown[]) => {
              const res = await target.query(sql, params);
              if (late === undefined && sql.includes("FOR UPDATE SKIP LOCKED") && res.rows.length === 0) {
                [late] = await write(db, topic, n(1));
                relay1.wake();
              }
              return res;
            };
          }
          return Reflect.get(target, prop, receiver);
        },
      });
      const r = recorder();
      relay1 = new Relay({ db: racy, publisher: r.publisher, topics: [topic], pollMs: 60_000 });
      await relay1.start();
      try {
        await until(() => late !== undefined && r.ids().includes(late), 3_000, "the late event");
      } finally {
        await relay1.stop();
      }
    });

    it("a listener that cannot subscribe is reported; polling still finds the work", async () => {
      const topic = unique("t");
      const [id] = await write(db, topic, n(1));
      const errors: string[] = [];
      const r = recorder();
      const relay1 = relay(topic, r.publisher, {
        pollMs: 20,
        listen: async () => {
          throw new Error("LISTEN refused");
        },
        onError: (e) => errors.push(e.message),
      });
      await relay1.start();
      try {
        await until(() => r.ids().includes(id!), 3_000, "the polled event");
      } finally {
        await relay1.stop();
      }
      // Said once, with how often it polls instead (the pollMs given wins over the 500 ms default).
      expect(errors).toContain("LISTEN refused; polling every 20 ms instead");
    });

    it("keeps going through database errors, backing off, and reports each one", async () => {
      const topic = unique("t");
      const [id] = await write(db, topic, n(1));
      let failures = 2;
      const times: number[] = [];
      const flaky: Db = new Proxy(db, {
        get(target, prop, receiver) {
          if (prop === "query") {
            return (sql: string, params?: unknown[]) => {
              if (failures > 0) {
                failures--;
                times.push(Date.now());
                return Promise.reject(new Error("connection reset"));
              }
              return target.query(sql, params);
            };
          }
          return Reflect.get(target, prop, receiver);
        },
      });
      const errors: string[] = [];
      const r = recorder();
      const relay1 = new Relay({
        db: flaky,
        publisher: r.publisher,
        topics: [topic],
        pollMs: 20,
        onError: (e) => errors.push(e.message),
      });
      await relay1.start();
      try {
        await until(() => r.ids().includes(id!), 5_000, "the event after the errors");
      } finally {
        await relay1.stop();
      }
      expect(errors).toEqual(["connection reset", "connection reset"]);
      // 500 ms after the first error (250 * 2^1), then 1 s after the second.
      expect(times[1]! - times[0]!).toBeGreaterThanOrEqual(450);
    });

    it("after a broker outage it waits before trying again, even when woken", async () => {
      const topic = unique("t");
      await write(db, topic, n(1));
      const times: number[] = [];
      let down = 2;
      const publisher: Publisher = {
        name: "down",
        publish: async (batch) => {
          times.push(Date.now());
          if (down-- > 0) throw new BrokerUnavailableError("down");
          return batch.map(() => ({ ok: true }));
        },
        close: async () => {},
      };
      const relay1 = relay(topic, publisher, { pollMs: 20 });
      await relay1.start();
      const waker = setInterval(() => relay1.wake(), 5);
      try {
        await until(() => times.length >= 3, 5_000, "three tries");
      } finally {
        clearInterval(waker);
        await relay1.stop();
      }
      // 250 ms after the first outage, 500 ms after the second.
      expect(times[1]! - times[0]!).toBeGreaterThanOrEqual(240);
      expect(times[1]! - times[0]!).toBeLessThan(480); // not yet the second outage's 500 ms
      expect(times[2]! - times[1]!).toBeGreaterThanOrEqual(490);
      expect(relay1.stats.unavailable).toBe(2);
    });

    it("a running relay deletes old published rows on its cleanup timer", async () => {
      const topic = unique("t");
      await db.query(
        `INSERT INTO idem.outbox (id, topic, type, payload, published_at)
         VALUES (gen_random_uuid(), $1, 'old', '{}'::jsonb, now() - interval '3 hours')`,
        [topic],
      );
      const relay1 = relay(topic, recorder().publisher, { retentionMs: 3_600_000, cleanupEveryMs: 20 });
      await relay1.start();
      try {
        await until(async () => (await rowsOf(db, topic)).length === 0, 3_000, "the cleanup");
      } finally {
        await relay1.stop();
      }
      expect(relay1.stats.deleted).toBeGreaterThanOrEqual(1);
    });

    it("runs `concurrency` loops side by side", async () => {
      const topic = unique("t");
      await write(db, topic, n(4));
      let inFlight = 0;
      let most = 0;
      const publisher: Publisher = {
        name: "slow",
        publish: async (batch) => {
          most = Math.max(most, ++inFlight);
          await new Promise((res) => setTimeout(res, 100));
          inFlight--;
          return batch.map(() => ({ ok: true }));
        },
        close: async () => {},
      };
      const relay1 = relay(topic, publisher, { batchSize: 1, concurrency: 2, pollMs: 20 });
      await relay1.start();
      await relay1.start(); // a second start changes nothing
      try {
        await until(async () => (await rowsOf(db, topic)).every((x) => x.published), 5_000, "all four");
      } finally {
        await relay1.stop();
      }
      expect(most).toBe(2);
    });

    /** The database, counting the relay's claims (empty or not). */
    const counting = () => {
      let claims = 0;
      const counted: Db = new Proxy(db, {
        get(target, prop, receiver) {
          if (prop === "query") {
            return (sql: string, params?: unknown[]) => {
              if (sql.includes("FOR UPDATE SKIP LOCKED")) claims++;
              return target.query(sql, params);
            };
          }
          return Reflect.get(target, prop, receiver);
        },
      });
      return { db: counted, claims: () => claims };
    };
    const pause = (ms: number) => new Promise((res) => setTimeout(res, ms));

    it("claims again at once after a batch with work, once per wake-up, and sleeps after an empty claim", async () => {
      const topic = unique("t");
      const c = counting();
      const r = recorder();
      const relay1 = new Relay({
        db: c.db,
        publisher: r.publisher,
        topics: [topic],
        pollMs: 60_000,
        batchSize: 1,
      });
      await relay1.start();
      try {
        relay1.wake(); // while the first claim is out: it is not lost, one more claim follows
        await pause(300);
        expect(c.claims()).toBe(2);
        relay1.wake(); // asleep: one claim, then asleep again
        await pause(300);
        expect(c.claims()).toBe(3);
        const ids = await write(db, topic, n(3));
        const t0 = Date.now();
        relay1.wake();
        await until(() => ids.every((id) => r.ids().includes(id)), 3_000, "the three events");
        expect(Date.now() - t0).toBeLessThan(2_000);
        await pause(300);
        expect(c.claims()).toBe(3 + 3 + 1); // one batch each, then one that found nothing
      } finally {
        await relay1.stop();
      }
    });

    it("stop() ends the loop at once when it comes while a claim is out", async () => {
      const topic = unique("t");
      let entered!: () => void;
      const claiming = new Promise<void>((res) => {
        entered = res;
      });
      let answer!: () => void;
      const held = new Promise<void>((res) => {
        answer = res;
      });
      const slow: Db = new Proxy(db, {
        get(target, prop, receiver) {
          if (prop === "query") {
            return async (sql: string, params?: unknown[]) => {
              if (sql.includes("FOR UPDATE SKIP LOCKED")) {
                entered();
                await held;
              }
              return target.query(sql, params);
            };
          }
          return Reflect.get(target, prop, receiver);
        },
      });
      const relay1 = new Relay({
        db: slow,
        publisher: recorder().publisher,
        topics: [topic],
        pollMs: 60_000,
      });
      await relay1.start();
      await claiming;
      const stopping = relay1.stop();
      answer();
      const t0 = Date.now();
      await stopping;
      expect(Date.now() - t0).toBeLessThan(2_000);
    });

    it("stop() ends the wait after a broker outage at once", async () => {
      const topic = unique("t");
      await write(db, topic, n(1));
      const times: number[] = [];
      const publisher: Publisher = {
        name: "down",
        publish: async () => {
          times.push(Date.now());
          throw new BrokerUnavailableError("down");
        },
        close: async () => {},
      };
      const relay1 = relay(topic, publisher, { pollMs: 20 });
      await relay1.start();
      try {
        await until(() => times.length >= 2, 5_000, "two tries");
        await pause(100); // into the 500 ms wait after the second outage
      } finally {
        const t0 = Date.now();
        await relay1.stop();
        expect(Date.now() - t0).toBeLessThan(250);
      }
      expect(times).toHaveLength(2);
    });

    it("a relay killed in its loop stops, reports nothing, and stays dead", async () => {
      const topic = unique("t");
      const [id] = await write(db, topic, n(1));
      const errors: Error[] = [];
      let kills = 1;
      const r = recorder();
      const relay1 = relay(topic, r.publisher, {
        pollMs: 20,
        leaseMs: 60_000,
        crash: (p) => p === "after-claim" && kills-- > 0,
        onError: (e) => errors.push(e),
      });
      await relay1.start();
      await until(() => !relay1.running, 3_000, "the crash");
      await pause(100);
      expect(errors).toEqual([]);
      expect(r.calls).toHaveLength(0);
      await expireLocks(db, topic);
      // Dead: even a crash point that no longer fires does not bring it back.
      await expect(relay1.runOnce()).rejects.toThrow("after-claim");
      expect(r.calls).toHaveLength(0);
      await relay1.stop();
      expect((await rowsOf(db, topic)).find((x) => x.id === id)!.published).toBe(false);
    });

    it("a failing cleanup is reported; the relay keeps running", async () => {
      const topic = unique("t");
      const errors: string[] = [];
      const failing: Db = new Proxy(db, {
        get(target, prop, receiver) {
          if (prop === "query") {
            return (sql: string, params?: unknown[]) =>
              sql.trimStart().startsWith("DELETE")
                ? Promise.reject(new Error("cleanup refused"))
                : target.query(sql, params);
          }
          return Reflect.get(target, prop, receiver);
        },
      });
      const [id] = await write(db, topic, n(1));
      const r = recorder();
      const relay1 = new Relay({
        db: failing,
        publisher: r.publisher,
        topics: [topic],
        pollMs: 20,
        cleanupEveryMs: 20,
        onError: (e) => errors.push(e.message),
      });
      await relay1.start();
      try {
        await until(() => errors.includes("cleanup refused") && r.ids().includes(id!), 3_000, "both");
        expect(relay1.running).toBe(true);
      } finally {
        await relay1.stop();
      }
    });
  });
});
