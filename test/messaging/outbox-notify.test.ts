/**
 * The outbox's wake-up trigger can be dropped and put back (`migrate(db, { outboxNotify })`, `idem migrate
 * --outbox-notify off|on`): without it a write notifies nobody, and a listening relay says so and polls
 * at the fast interval instead of waiting 5 s between looks.
 */
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { listenWithPg } from "../../src/messaging/listen.ts";
import { Relay } from "../../src/messaging/relay.ts";
import type { OutboxMessage, Publisher } from "../../src/messaging/types.ts";
import type { Db } from "../../src/postgres/db.ts";
import { migrate } from "../../src/postgres/migrate.ts";
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

  it("a write wakes no listener without it, and one with it", async () => {
    const { db } = open;
    await migrate(db, { outboxNotify: false });
    await writeCredits(db, 3, unique("t"));
    await new Promise((r) => setTimeout(r, 300));
    expect(heard).toEqual([]);
    await migrate(db, { outboxNotify: true });
    await writeCredits(db, 1, unique("t"));
    await until(() => heard.length === 1, 3_000, "a notification");
    expect(heard).toEqual(["idem_outbox"]);
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
        "idem.outbox has no NOTIFY trigger (migrate with outboxNotify: false, or Citus), so nothing wakes this relay: polling every 500 ms",
      ]);
      await new Promise((r) => setTimeout(r, 100)); // its first look found nothing: it sleeps
      const t0 = Date.now();
      await writeCredits(db, 1, topic);
      await until(() => published.length === 1, 3_000, "the event published");
      expect(Date.now() - t0).toBeLessThan(1_500); // not the 5 s a listening relay polls at
    } finally {
      await relay.stop();
      await pool.end();
      await migrate(db, { outboxNotify: true });
    }
  });
});
