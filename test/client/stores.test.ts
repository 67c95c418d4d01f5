/**
 * Every intent store keeps the same promises, and a restarted client (a new client on the same
 * store) finds its pending intents and resumes them with the same key.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { FileIntentStore } from "../../src/client/file-store.ts";
import {
  createClient,
  type IntentStore,
  isAttemptsExhaustedError,
  LocalStorageIntentStore,
  MemoryIntentStore,
  newIntentRecord,
} from "../../src/client/index.ts";
import { PostgresIntentStore } from "../../src/client/postgres-store.ts";
import { backends } from "../helpers/db.ts";
import { MapStorage, type PaymentServer, startPaymentServer } from "./helpers.ts";

/** A store kind: `open()` gives a store on some backing; `reopen()` a fresh instance on the same backing. */
interface StoreKind {
  name: string;
  open(): Promise<{ store: IntentStore; reopen(): IntentStore; close(): Promise<void> }>;
}

const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

const kinds: StoreKind[] = [
  {
    name: "memory",
    async open() {
      const store = new MemoryIntentStore();
      return { store, reopen: () => store, close: async () => {} };
    },
  },
  {
    name: "localStorage",
    async open() {
      const storage = new MapStorage();
      storage.setItem("unrelated", "not json {");
      return {
        store: new LocalStorageIntentStore({ storage }),
        reopen: () => new LocalStorageIntentStore({ storage }),
        close: async () => {},
      };
    },
  },
  {
    name: "file",
    async open() {
      const dir = await mkdtemp(join(tmpdir(), "idem-intents-"));
      dirs.push(dir);
      return {
        store: new FileIntentStore({ dir }),
        reopen: () => new FileIntentStore({ dir }),
        close: async () => {},
      };
    },
  },
  ...backends.map(
    (backend): StoreKind => ({
      name: `postgres (${backend.name})`,
      async open() {
        const opened = await backend.open();
        const store = new PostgresIntentStore(opened.db);
        await store.install();
        await store.install(); // idempotent
        return { store, reopen: () => new PostgresIntentStore(opened.db), close: () => opened.close() };
      },
    }),
  ),
];

describe.each(kinds)("$name intent store", (kind) => {
  let server: PaymentServer | undefined;
  afterEach(async () => {
    await server?.close();
    server = undefined;
  });

  it("keeps records: create-if-absent, get, save, list by status oldest first, delete", async () => {
    const { store, close } = await kind.open();
    try {
      const a = newIntentRecord("order-1", new Date("2025-01-01T00:00:00Z"));
      const b = newIntentRecord("order-2", new Date("2025-01-01T00:00:01Z"));
      expect(await store.create(b)).toEqual(b);
      expect(await store.create(a)).toEqual(a);
      // A second create with the same id returns the stored record (and its key), not the new one.
      const again = await store.create(newIntentRecord("order-1"));
      expect(again.key).toBe(a.key);

      a.request = {
        method: "POST",
        url: "http://x.test/p",
        headers: [["content-type", "application/json"]],
        body: { base64: "AAEC/w==" },
      };
      a.status = "done";
      a.outcome = { status: 201 };
      a.attempts = 2;
      a.expiresAt = "2025-01-02T00:00:00.000Z";
      a.lastAnswer = { status: 201 };
      await store.save(a);
      expect(await store.get("order-1")).toEqual(a);
      // What the server said, including an uncertain operation and its reference, round-trips too.
      const u = {
        ...b,
        status: "uncertain" as const,
        lastAnswer: {
          status: 409,
          operationState: "uncertain" as const,
          operationRef: "op_7",
          safeNewKey: false,
        },
      };
      await store.save(u);
      expect(await store.get("order-2")).toEqual(u);
      expect((await store.list({ status: "uncertain" })).map((r) => r.id)).toEqual(["order-2"]);
      await store.save(b);
      expect(await store.get("nope")).toBeUndefined();
      expect((await store.list()).map((r) => r.id)).toEqual(["order-1", "order-2"]);
      expect((await store.list({ status: "pending" })).map((r) => r.id)).toEqual(["order-2"]);
      await store.delete("order-2");
      await store.delete("order-2");
      expect((await store.list()).map((r) => r.id)).toEqual(["order-1"]);
    } finally {
      await close();
    }
  });

  it("a restarted client finds the pending intent and resumes it with the same key: one charge", async () => {
    server = await startPaymentServer(["charge-and-drop"]);
    const { store, reopen, close } = await kind.open();
    try {
      const before = createClient({ baseUrl: server.url, store, maxAttempts: 1 });
      const intent = await before.intent("checkout-42");
      const err = await before.post("/payments", { amount_cents: 5000 }, { intent }).catch((e) => e);
      expect(isAttemptsExhaustedError(err)).toBe(true); // the reply was lost: outcome unknown

      // "Restart": a new client and a new store instance over the same storage.
      const after = createClient({ baseUrl: server.url, store: reopen() });
      const pending = await after.pending();
      expect(pending.map((p) => [p.id, p.key])).toEqual([["checkout-42", intent.key]]);
      expect(pending[0]?.request).toMatchObject({ method: "POST", body: { text: '{"amount_cents":5000}' } });

      const res = await after.resume("checkout-42");
      expect(res.status).toBe(201);
      expect(res.headers.get("idempotent-replayed")).toBe("true");
      expect(server.seen.map((r) => r.key)).toEqual([intent.key, intent.key]);
      expect(server.totalCharges()).toBe(1);
      expect(await after.pending()).toEqual([]);
      expect(await after.store.get("checkout-42")).toMatchObject({
        status: "done",
        attempts: 2,
        outcome: { status: 201 },
      });
      // Beginning the same intent id again returns it with its key.
      expect((await after.intent("checkout-42")).key).toBe(intent.key);
    } finally {
      await close();
    }
  });
});

describe.each(backends)("postgres intent store on $name", (backend) => {
  it("install() upgrades a table made before expires_at, last_answer and the uncertain status", async () => {
    const { db, close } = await backend.open();
    try {
      await db.query("CREATE SCHEMA old_client");
      await db.query(`CREATE TABLE old_client.client_intents (
        id text PRIMARY KEY, key text NOT NULL UNIQUE,
        status text NOT NULL CHECK (status IN ('pending', 'done', 'abandoned')),
        request jsonb, attempts integer NOT NULL DEFAULT 0, outcome_status integer,
        created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL)`);
      await db.query(
        `INSERT INTO old_client.client_intents VALUES ('order-1', 'k-1', 'pending', NULL, 1, NULL, now(), now())`,
      );
      const store = new PostgresIntentStore(db, { schema: "old_client" });
      await store.install();
      await store.install();
      const old = await store.get("order-1");
      expect(old).toMatchObject({ id: "order-1", key: "k-1", status: "pending", attempts: 1 });
      expect(old?.expiresAt).toBeUndefined();
      await store.save({ ...old!, status: "uncertain", lastAnswer: { status: 409, operationRef: "op_1" } });
      expect(await store.get("order-1")).toMatchObject({
        status: "uncertain",
        lastAnswer: { operationRef: "op_1" },
      });
      await expect(store.save({ ...old!, status: "bogus" as never })).rejects.toThrow();
    } finally {
      await close();
    }
  });

  it("records the intent in the caller's own transaction: committed with the business row, or not at all", async () => {
    const { db, close } = await backend.open();
    try {
      const intents = new PostgresIntentStore(db, { schema: "outgoing", table: "calls" });
      await intents.install();
      await db.query("CREATE TABLE orders (id text PRIMARY KEY)");
      await db.transaction(async (tx) => {
        await tx.query("INSERT INTO orders (id) VALUES ($1)", ["order-1"]);
        await intents.using(tx).create(newIntentRecord("order-1"));
      });
      await db
        .transaction(async (tx) => {
          await tx.query("INSERT INTO orders (id) VALUES ($1)", ["order-2"]);
          await intents.using(tx).create(newIntentRecord("order-2"));
          throw new Error("rolled back");
        })
        .catch(() => {});
      const client = createClient({ store: intents });
      expect((await client.pending()).map((i) => i.id)).toEqual(["order-1"]);
      const { rows } = await db.query("SELECT count(*)::int AS n FROM outgoing.calls");
      expect(rows[0]).toEqual({ n: 1 });
    } finally {
      await close();
    }
  });
});
