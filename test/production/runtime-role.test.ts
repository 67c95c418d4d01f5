/**
 * The reference service running as a role with DML rights only (no CREATE anywhere), as production DBAs
 * set it up: the owner migrates and grants (`prepareSchema(db, { runtimeRole })`, what
 * `npm run payments -- migrate --runtime-role ROLE` runs) and sweeps; the service starts, serves keyed
 * requests, replays and duplicates, runs no DDL, and answers 503 with Retry-After (never 500, never a
 * second run) when a partition is missing, until the owner's sweep makes it.
 */
import { randomBytes, randomUUID } from "node:crypto";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ApiKeys, ensureDemoAccounts } from "../../app/accounts.ts";
import { createApp } from "../../app/app.ts";
import { AppSchemaBehindError, ensureSchema, prepareSchema } from "../../app/database.ts";
import { createLogger } from "../../app/observability.ts";
import { fingerprint } from "../../src/core/index.ts";
import { listActions, recordAction } from "../../src/postgres/admin/admin-actions.ts";
import type { Db } from "../../src/postgres/db.ts";
import { openDatabaseUrl } from "../../src/postgres/drivers/connect.ts";
import { definePhases, jsonResponse } from "../../src/postgres/phases/index.ts";
import { migrate, SchemaBehindError } from "../../src/postgres/schema/migrate.ts";
import { PartitionMissingError } from "../../src/postgres/schema/partitions.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { pay } from "../app/service.ts";
import { DATABASE_URL, freshDatabase } from "../helpers/db.ts";
import { TestTime } from "../helpers/time.ts";

const DAY = 86_400_000;

describe.skipIf(!DATABASE_URL)("the service as a role without CREATE", () => {
  const role = `idem_rt_${randomBytes(4).toString("hex")}`;
  let fresh: Awaited<ReturnType<typeof freshDatabase>>;
  let owner: Db;
  let runtime: Db;
  const time = new TestTime(); // the database's clock, moved for every store given it
  let store: PostgresStore;
  let url: string;
  let stop: () => Promise<void>;
  const payments = async () =>
    Number((await owner.query<{ n: number }>("SELECT count(*)::int AS n FROM payments")).rows[0]!.n);

  beforeAll(async () => {
    fresh = await freshDatabase("rt");
    owner = (await openDatabaseUrl(fresh.url)).db;
    await owner.exec(`CREATE ROLE ${role} LOGIN; REVOKE ALL ON DATABASE ${new URL(fresh.url).pathname.slice(1)} FROM PUBLIC;
      GRANT CONNECT ON DATABASE ${new URL(fresh.url).pathname.slice(1)} TO ${role}`);
    const extras = await prepareSchema(owner, { runtimeRole: role });
    expect(extras).toEqual([]); // no superuser, no CREATE on the database, idem's schema or public
    await ensureDemoAccounts(owner);
    const asRole = new URL(fresh.url);
    asRole.username = role;
    runtime = (await openDatabaseUrl(asRole.toString())).db;
    await ensureSchema(runtime); // current: nothing to do, and no DDL tried
    store = await PostgresStore.open(runtime, { timeShift: time });
    const app = createApp({
      paymentsMode: "atomic",
      db: runtime,
      store,
      apiKeys: new ApiKeys(runtime),
      logger: createLogger({ level: "silent" }),
    });
    const server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" });
    await new Promise<void>((r) => server.once("listening", () => r()));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    stop = () => new Promise<void>((r) => server.close(() => r()));
  }, 60_000);

  afterAll(async () => {
    await stop?.();
    await runtime?.close();
    await owner?.exec(`DROP OWNED BY ${role}`).catch(() => {});
    await owner?.close();
    await fresh?.drop();
    const admin = (await openDatabaseUrl(DATABASE_URL!)).db;
    await admin.exec(`DROP ROLE IF EXISTS ${role}`).catch(() => {});
    await admin.close();
  });

  it("has no CREATE anywhere, so any DDL would fail", async () => {
    await expect(runtime.exec("CREATE TABLE idem.x (a int)")).rejects.toMatchObject({ code: "42501" });
    await expect(runtime.exec("CREATE TABLE public.x (a int)")).rejects.toMatchObject({ code: "42501" });
    await expect(runtime.exec("CREATE SCHEMA x")).rejects.toMatchObject({ code: "42501" });
  });

  it("may pass outboxNotify at every start: no DDL once the trigger is as asked", async () => {
    await expect(migrate(runtime, { outboxNotify: true })).resolves.toEqual({ applied: [] });
    // A change is the owner's: the service's role may not drop the trigger.
    await expect(migrate(runtime, { outboxNotify: false })).rejects.toMatchObject({ code: "42501" });
    await migrate(owner, { outboxNotify: false });
    await expect(migrate(runtime, { outboxNotify: false })).resolves.toEqual({ applied: [] });
    await migrate(owner, { outboxNotify: true });
  });

  it("records people's actions but may not rewrite or delete them (admin_actions is append-only)", async () => {
    const a = await recordAction(runtime, { actor: "alice", action: "audit.run", details: { ok: true } });
    expect(a).toMatchObject({ actor: "alice", action: "audit.run" });
    expect(await listActions(runtime, { action: "audit.run" })).toHaveLength(1);
    await expect(runtime.query("UPDATE idem.admin_actions SET actor = 'mallory'")).rejects.toMatchObject({
      code: "42501",
    });
    await expect(runtime.query("DELETE FROM idem.admin_actions")).rejects.toMatchObject({ code: "42501" });
  });

  it("serves keyed requests, replays and concurrent duplicates: one payment per key", async () => {
    const before = await payments();
    const key = randomUUID();
    const first = await pay(url, { key });
    expect(first.status).toBe(201);
    const again = await pay(url, { key });
    expect(again.status).toBe(201);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(await again.text()).toBe(await first.text());
    const dup = randomUUID();
    const replies = await Promise.all(Array.from({ length: 10 }, () => pay(url, { key: dup })));
    expect(replies.map((r) => r.status)).toEqual(Array(10).fill(201));
    expect(new Set(await Promise.all(replies.map((r) => r.text()))).size).toBe(1);
    expect((await payments()) - before).toBe(2);
  });

  it("answers 503 with Retry-After when a partition is missing, runs nothing, then works after the sweep", async () => {
    const before = await payments();
    time.offsetMs = 10 * DAY; // the owner's sweep stopped ten days ago: no partition for now
    try {
      const key = randomUUID();
      const refused = await pay(url, { key });
      expect(refused.status).toBe(503);
      expect(refused.headers.get("retry-after")).toBe("5");
      const problem = await refused.json();
      expect(problem).toMatchObject({ retry_same_key: true });
      expect(problem.detail).toMatch(/idem sweep/);
      expect(await payments()).toBe(before); // nothing ran
      // A store opened now says what to run, by name.
      const err = await PostgresStore.open(runtime, { timeShift: time }).catch((e) => e);
      expect(err).toBeInstanceOf(PartitionMissingError);
      // The owner's sweep (its clock is the same) makes the partitions; the retry then runs once.
      await (await PostgresStore.open(owner, { timeShift: time })).sweep();
      const retried = await pay(url, { key });
      expect(retried.status).toBe(201);
      const replay = await pay(url, { key });
      expect(replay.headers.get("idempotent-replayed")).toBe("true");
      expect((await payments()) - before).toBe(1);
    } finally {
      time.offsetMs = 0;
    }
  });

  it("records a phases key's history, append-only, in the partition the owner's sweep made", async () => {
    const runner = definePhases<{ n: number }>({
      store,
      name: "history",
      phases: {
        first: { external: async () => ({ data: { seen: true } }), next: "second" },
        second: { local: async () => ({ response: jsonResponse(201, { ok: true }) }) },
      },
    });
    const claim = (key: string) => ({
      scope: "acct_history",
      key,
      fingerprint: fingerprint({
        method: "POST",
        path: "/h",
        contentType: "application/json",
        body: new Uint8Array(),
      }),
    });
    const kinds = async (key: string) =>
      (
        await runtime.query<{ kind: string }>(
          "SELECT kind FROM idem.key_events WHERE scope = 'acct_history' AND key = $1 ORDER BY at",
          [key],
        )
      ).rows.map((r) => r.kind);
    time.offsetMs = 20 * DAY; // past every partition made so far, keys' and history's
    try {
      const key = randomUUID();
      await expect(runner.run(claim(key), { n: 1 })).rejects.toBeInstanceOf(PartitionMissingError);
      const partitions = async (table: string) =>
        (
          await owner.query<{ b: string }>(
            `SELECT substring(relname FROM '_b(-?[0-9]+)$') AS b FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid
              WHERE i.inhparent = $1::regclass ORDER BY 1`,
            [`idem.${table}`],
          )
        ).rows.map((r) => r.b);
      const old = await partitions("key_events");
      await (await PostgresStore.open(owner, { timeShift: time })).sweep();
      // The history's partitions are made and dropped with the keys': today's went with its keys.
      expect(await partitions("key_events")).toEqual(await partitions("keys"));
      expect(await partitions("key_events")).not.toContain(old[0]);
      expect(await runner.run(claim(key), { n: 1 })).toMatchObject({ kind: "executed" });
      expect(await kinds(key)).toEqual(["claimed", "recovery-point", "saved"]);
    } finally {
      time.offsetMs = 0;
    }
    await expect(runtime.query("UPDATE idem.key_events SET kind = 'x'")).rejects.toMatchObject({
      code: "42501",
    });
    await expect(runtime.query("DELETE FROM idem.key_events")).rejects.toMatchObject({ code: "42501" });
  });

  it("refuses to start on a schema behind, naming the command to run", async () => {
    const [last] = (
      await owner.query<{ id: number; name: string }>(
        "SELECT id, name FROM idem.migrations ORDER BY id DESC LIMIT 1",
      )
    ).rows;
    await owner.query("DELETE FROM idem.migrations WHERE id = $1", [last!.id]);
    try {
      const err = await PostgresStore.open(runtime).catch((e) => e);
      expect(err).toBeInstanceOf(SchemaBehindError);
      expect(err.message).toMatch(/run `idem migrate`/);
      const app = await ensureSchema(runtime).catch((e) => e);
      expect(app).toBeInstanceOf(AppSchemaBehindError);
      expect(app.message).toMatch(/npm run payments -- migrate --runtime-role/);
    } finally {
      await owner.query("INSERT INTO idem.migrations (id, name) VALUES ($1, $2)", [last!.id, last!.name]);
    }
  });
});
