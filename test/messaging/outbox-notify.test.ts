/**
 * How relays are woken. A transaction run by idem's drivers (fromPg, fromPostgresJs) notifies nobody
 * from inside: its driver sends a NOTIFY after the commit, shared with other transactions'. Other
 * writers are announced by the outbox's trigger, which can be dropped and put back
 * (`migrate(db, { outboxNotify })`, `idem migrate --outbox-notify off|on`); without it a listening
 * relay says so and polls at the fast interval instead of waiting 5 s between looks.
 */
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Relay } from "../../src/messaging/relay.ts";
import type { OutboxMessage, Publisher } from "../../src/messaging/types.ts";
import type { Db } from "../../src/postgres/db.ts";
import { listenWithPg } from "../../src/postgres/drivers/listen.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { backends, type OpenDb, serverBackends } from "../helpers/db.ts";
import { prepare, unique, until, writeCredits } from "./helpers.ts";

async function triggers(db: Db): Promise<number> {
  const { rows } = await db.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM pg_trigger WHERE tgrelid = 'idem.outbox'::regclass AND tgname = 'outbox_notify'",
  );
  return Number(rows[0]!.n);
}

describe.each(backends)("the outbox's NOTIFY trigger on $name", (backend) => {
  let open: OpenDb;
  beforeAll(async () => {
    open = await backend.open();
    await prepare(open.db);
  });
  afterAll(() => open?.close());

  it("is dropped by outboxNotify: false, kept by a plain migrate, and put back by outboxNotify: true", async () => {
    const { db } = open;
    expect(await triggers(db)).toBe(1);
    await migrate(db, { outboxNotify: false });
    await migrate(db, { outboxNotify: false }); // again: nothing to do, no error
    expect(await triggers(db)).toBe(0);
    await migrate(db); // leaves it as it is
    expect(await triggers(db)).toBe(0);
    await Promise.all([migrate(db, { outboxNotify: true }), migrate(db, { outboxNotify: true })]);
    expect(await triggers(db)).toBe(1);
  });
});

describe.each(serverBackends)("relays without the NOTIFY trigger on $name", (backend) => {
  let open: OpenDb;
  let listener: pg.Client;
  const heard: string[] = [];
  beforeAll(async () => {
    open = await backend.open();
    await prepare(open.db);
    listener = new pg.Client({ connectionString: open.url });
    await listener.connect();
    listener.on("notification", (n) => heard.push(n.channel));
    await listener.query("LISTEN idem_outbox");
  });
  afterAll(async () => {
    await listener?.end();
    await open?.close();
  });

  /** One event written in the caller's own transaction on a plain pg client: the trigger's path. */
  async function writeOnOwnClient(topic: string): Promise<void> {
    const c = new pg.Client({ connectionString: open.url });
    await c.connect();
    try {
      await c.query("BEGIN");
      await writeOutbox(c, { topic, type: "wallet.credited", payload: { cents: 1 } });
      await c.query("COMMIT");
    } finally {
      await c.end();
    }
  }
  const settle = () => new Promise((r) => setTimeout(r, 300));

  it("without it, a write in your own transaction wakes no listener, one through idem's driver does", async () => {
    const { db } = open;
    await migrate(db, { outboxNotify: false });
    try {
      heard.length = 0;
      await writeOnOwnClient(unique("t"));
      await settle();
      expect(heard).toEqual([]);
      await writeCredits(db, 3, unique("t")); // the driver notifies after the commit
      await until(() => heard.length > 0, 3_000, "a notification");
      await migrate(db, { outboxNotify: true });
      heard.length = 0;
      await writeOnOwnClient(unique("t"));
      await until(() => heard.length === 1, 3_000, "the trigger's notification");
      expect(heard).toEqual(["idem_outbox"]);
    } finally {
      await migrate(db, { outboxNotify: true });
    }
  });

  it("a transaction through idem's driver that rolls back wakes nobody", async () => {
    const { db } = open;
    await settle();
    heard.length = 0;
    await expect(
      db.transaction(async (tx) => {
        await writeOutbox(tx, { topic: unique("t"), type: "never", payload: {} });
        throw new Error("rolled back");
      }),
    ).rejects.toThrow("rolled back");
    await settle();
    expect(heard).toEqual([]);
  });

  it("transactions through idem's driver share NOTIFYs sent after their commits", async () => {
    const { db } = open;
    await settle();
    heard.length = 0;
    const topic = unique("t");
    // 40 at once: from inside each transaction (the trigger's way) they would be 40 NOTIFYs.
    await Promise.all(Array.from({ length: 40 }, () => writeCredits(db, 1, topic)));
    await settle();
    expect(heard.length).toBeGreaterThanOrEqual(1);
    expect(heard.length).toBeLessThan(40);
    expect(new Set(heard)).toEqual(new Set(["idem_outbox"]));
  });

  it("a listening relay says nothing will wake it, and publishes within its fast poll", async () => {
    const { db } = open;
    await migrate(db, { outboxNotify: false });
    const topic = unique("t");
    const published: OutboxMessage[] = [];
    const publisher: Publisher = {
      name: "recorder",
      async publish(batch) {
        published.push(...batch);
        return batch.map(() => ({ ok: true as const }));
      },
      async close() {},
    };
    const errors: Error[] = [];
    const pool = new pg.Pool({ connectionString: open.url, max: 1 });
    const relay = new Relay({
      db,
      publisher,
      topics: [topic],
      listen: listenWithPg(() => pool.connect()),
      onError: (err) => errors.push(err),
    });
    await relay.start();
    try {
      expect(errors.map((e) => e.message)).toEqual([
        "idem.outbox has no NOTIFY trigger (migrate with outboxNotify: false, or Citus): only events written through idem's drivers or ORM integrations wake this relay; polling every 500 ms for the others",
      ]);
      await new Promise((r) => setTimeout(r, 100)); // its first look found nothing: it sleeps
      const t0 = Date.now();
      await writeOnOwnClient(topic); // no NOTIFY at all: the relay's poll finds it
      await until(() => published.length === 1, 3_000, "the event published");
      expect(Date.now() - t0).toBeLessThan(1_500); // not the 5 s a listening relay polls at
    } finally {
      await relay.stop();
      await pool.end();
      await migrate(db, { outboxNotify: true });
    }
  });
});
