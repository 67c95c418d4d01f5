/**
 * Single-statement mode (src/postgres/statement/): the claim, the work and the saved reply in one
 * autocommitted statement, with atomic mode's guarantees. Every backend (PGlite; pg and postgres.js on
 * the real server); the races that need two connections on the real server only.
 */
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { isKeyInFlightError, isKeyMismatchError } from "../../src/core/index.ts";
import { AesGcmSealer } from "../../src/core/sealing.ts";
import { readOperation } from "../../src/postgres/keys/operations.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import {
  SingleStatementStore,
  StatementModeError,
  type StatementSpec,
} from "../../src/postgres/statement/store.ts";
import { PostgresStore, type PostgresStoreOptions } from "../../src/postgres/store.ts";
import { paymentClaim } from "../helpers/claim.ts";
import { backends, type OpenDb, serverBackends } from "../helpers/db.ts";
import { TestTime } from "../helpers/time.ts";

const HOUR = 3_600_000;
const DAY = 24 * HOUR;
const dec = new TextDecoder();

/** The payment: one INSERT gated on the claim, its reply the row as JSON. */
function pay(note: string, amount = 500): StatementSpec {
  return {
    sql: `INSERT INTO payments (note, amount_cents, claim_id)
          SELECT $1, $2, claim_id FROM idem_claim
          RETURNING id, note, amount_cents`,
    params: [note, amount],
    body: "json_build_object('id', id, 'note', note, 'amount_cents', amount_cents)::text",
    status: 201,
    headers: { "content-type": "application/json" },
  };
}

/** A statement that returns no row (it changes nothing), answered with its own empty reply. */
const CHANGES_NOTHING: StatementSpec = {
  sql: "UPDATE payments SET amount_cents = amount_cents + $1 FROM idem_claim WHERE note = 'nobody' RETURNING payments.id",
  params: [1],
  empty: { status: 404, body: "none" },
};

async function payments(open: OpenDb, note: string): Promise<number> {
  const { rows } = await open.db.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM payments WHERE note = $1",
    [note],
  );
  return rows[0]!.n;
}

async function keyRows(open: OpenDb, key: string): Promise<Array<{ bucket: number; marker: boolean }>> {
  const { rows } = await open.db.query<{ bucket: number; marker: boolean }>(
    "SELECT bucket, marker FROM idem.keys WHERE key = $1 ORDER BY bucket",
    [key],
  );
  return rows;
}

async function setUp(open: OpenDb): Promise<void> {
  await migrate(open.db);
  await open.db.exec(
    "CREATE TABLE payments (id serial PRIMARY KEY, note text NOT NULL, amount_cents int NOT NULL, claim_id uuid)",
  );
}

describe.each(backends)("single-statement store on $name", (backend) => {
  let open: OpenDb;
  let base: PostgresStore;
  let store: SingleStatementStore;
  const stores = async (options: PostgresStoreOptions = {}) =>
    new SingleStatementStore(await PostgresStore.open(open.db, options));

  beforeAll(async () => {
    open = await backend.open();
    await setUp(open);
    base = await PostgresStore.open(open.db);
    store = new SingleStatementStore(base);
  });
  afterAll(() => open.close());

  it("runs the statement once and replays its saved reply byte for byte", async () => {
    const c = paymentClaim("acct_1", "k-once", '{"a":1}');
    const first = await store.runStatement(c, pay("once"));
    expect(first.kind).toBe("executed");
    if (first.kind !== "executed") throw new Error("unreachable");
    expect(first.saved).toBe(true);
    expect(first.response.status).toBe(201);
    const sent = JSON.parse(dec.decode(first.response.body));
    expect(sent).toMatchObject({ note: "once", amount_cents: 500 });
    const again = await store.runStatement(c, pay("once"));
    expect(again.kind).toBe("replayed");
    expect(Buffer.from(again.response.body)).toEqual(Buffer.from(first.response.body));
    expect(again.response.status).toBe(201);
    expect(again.response.headers).toEqual([["content-type", "application/json"]]);
    expect(again.claimId).toBe(first.claimId);
    expect(await payments(open, "once")).toBe(1);
    // The payment names its claim: the key row's claim id.
    const { rows } = await open.db.query<{ claim_id: string }>(
      "SELECT claim_id::text AS claim_id FROM payments WHERE note = 'once'",
    );
    expect(rows[0]!.claim_id).toBe(first.claimId);
  });

  it("lets replays of one finished key that come together share one read, each with its own answer", async () => {
    const lookups: unknown[] = [];
    const counted = {
      ...open.db,
      query: (sql: string, params?: readonly unknown[]) => {
        if (/ AS live, body\s/.test(sql)) lookups.push(params?.[1]); // a read without a lock
        return open.db.query(sql, params);
      },
    } as typeof open.db;
    const s = new SingleStatementStore(await PostgresStore.open(counted));
    const c = paymentClaim("acct_1", "k-storm", '{"a":1}');
    const first = await s.runStatement(c, pay("storm"));
    expect(first.kind).toBe("executed");
    // 20 replays at once and a retry whose body changed, in one turn of the event loop: one read.
    const answers = await Promise.all(Array.from({ length: 20 }, () => s.runStatement(c, pay("storm"))));
    const changed = await s
      .runStatement(paymentClaim("acct_1", "k-storm", '{"a":2}'), pay("storm"))
      .catch((e) => e);
    expect(isKeyMismatchError(changed)).toBe(true);
    expect(lookups.filter((k) => k === "k-storm").length).toBe(2); // the 20 together, then the changed one
    for (const a of answers) {
      expect(a.kind).toBe("replayed");
      expect(Buffer.from(a.response.body)).toEqual(Buffer.from(first.response.body));
    }
    answers[0]!.response.headers.push(["x-added", "1"]);
    expect(answers[1]!.response.headers).toEqual([["content-type", "application/json"]]);
    expect(await payments(open, "storm")).toBe(1);
  });

  it("is an ordinary key row: inspection, the operation lookup and atomic mode see it", async () => {
    const c = paymentClaim("acct_1", "k-seen", "{}");
    const first = await store.runStatement(c, pay("seen"));
    const seen = await base.inspect("acct_1", "k-seen");
    expect(seen).toMatchObject({ state: "done", claimId: first.claimId });
    expect(seen!.saved).toMatchObject({ status: 201, headers: [["content-type", "application/json"]] });
    const op = await readOperation(base, "acct_1", "k-seen");
    expect(op?.answer).toMatchObject({ kind: "reply" });
    // Atomic mode on the same key replays it (same table, same replay code).
    const viaAtomic = await base.atomic(c, async () => {
      throw new Error("must not run");
    });
    expect(viaAtomic.kind).toBe("replayed");
    expect(Buffer.from(viaAtomic.response.body)).toEqual(Buffer.from(first.response.body));
  });

  it("answers 422 for another request under the same key, and runs nothing", async () => {
    await store.runStatement(paymentClaim("acct_1", "k-422", '{"a":1}'), pay("fp"));
    const other = store.runStatement(paymentClaim("acct_1", "k-422", '{"a":2}'), pay("fp", 900));
    await expect(other).rejects.toSatisfy(isKeyMismatchError);
    expect(await payments(open, "fp")).toBe(1);
  });

  it("keeps scopes apart", async () => {
    const a = await store.runStatement(paymentClaim("acct_1", "k-scope", "{}"), pay("scope"));
    const b = await store.runStatement(paymentClaim("acct_2", "k-scope", "{}"), pay("scope"));
    expect([a.kind, b.kind]).toEqual(["executed", "executed"]);
    expect(await payments(open, "scope")).toBe(2);
  });

  it("saves nothing when the statement returned no row, and answers the route's empty reply", async () => {
    const c = paymentClaim("acct_1", "k-empty", "{}");
    const out = await store.runStatement(c, CHANGES_NOTHING);
    expect(out).toMatchObject({ kind: "executed", saved: false });
    expect(out.response.status).toBe(404);
    expect(dec.decode(out.response.body)).toBe("none");
    expect(await keyRows(open, "k-empty")).toEqual([]);
    // Without `empty`: 404 problem+json.
    const plain = await store.runStatement(paymentClaim("acct_1", "k-empty-2", "{}"), {
      ...CHANGES_NOTHING,
      empty: undefined,
    });
    expect(plain.response.status).toBe(404);
    expect(plain.response.headers).toContainEqual(["content-type", "application/problem+json"]);
    expect(JSON.parse(dec.decode(plain.response.body))).toMatchObject({ status: 404 });
  });

  it("refuses a statement that does not read idem_claim, and one that runs without it", async () => {
    const ungated: StatementSpec = {
      sql: "INSERT INTO payments (note, amount_cents) VALUES ('x', 1) RETURNING id",
    };
    expect(() => store.runStatement(paymentClaim("acct_1", "k-shape", "{}"), ungated)).toThrow(
      StatementModeError,
    );
    // Mentions idem_claim but does not read its rows: it would run for a duplicate too; caught in SQL.
    const c = paymentClaim("acct_1", "k-sneaky", "{}");
    await store.runStatement(c, pay("sneaky"));
    const sneaky: StatementSpec = {
      sql: "INSERT INTO payments (note, amount_cents) SELECT 'sneaky', 1 WHERE (SELECT true FROM idem_claim) IS NULL RETURNING id",
    };
    // (Another store: this one knows the key is finished and would only read its replay.)
    const other = new SingleStatementStore(base);
    await expect(other.runStatement(c, sneaky)).rejects.toThrow(/without reading FROM idem_claim/);
    expect(await payments(open, "sneaky")).toBe(1);
  });

  it("rethrows the statement's own unique violation (not a duplicate of the key), keeping nothing", async () => {
    await open.db.exec("CREATE TABLE IF NOT EXISTS orders (ref text PRIMARY KEY)");
    const order: StatementSpec = {
      sql: "INSERT INTO orders (ref) SELECT 'o-1' FROM idem_claim RETURNING ref",
    };
    expect((await store.runStatement(paymentClaim("acct_1", "k-order-1", "{}"), order)).kind).toBe(
      "executed",
    );
    const err = await store.runStatement(paymentClaim("acct_1", "k-order-2", "{}"), order).catch((e) => e);
    expect((err as { code?: string }).code).toBe("23505");
    expect(await keyRows(open, "k-order-2")).toEqual([]);
  });

  it("refuses a sealing store: the reply is built in SQL, which cannot seal it", async () => {
    const sealer = new AesGcmSealer([{ id: "k1", key: new Uint8Array(32).fill(7) }]);
    const sealed = await PostgresStore.open(open.db, { sealer });
    expect(() => new SingleStatementStore(sealed)).toThrow(StatementModeError);
  });

  it("forgets a key after its retention, and replaces its expired row in the same partition", async () => {
    const now = new TestTime(Date.UTC(2031, 5, 1, 12));
    const s = await stores({ timeShift: now, retentionMs: 60_000 });
    const c = paymentClaim("acct_1", "k-expire", "{}");
    expect((await s.runStatement(c, pay("expire"))).kind).toBe("executed");
    expect((await s.runStatement(c, pay("expire"))).kind).toBe("replayed");
    now.ms += 61_000; // past retention, same daily partition: the old row is still there
    const fresh = await s.runStatement(c, pay("expire"));
    expect(fresh.kind).toBe("executed");
    expect(await payments(open, "expire")).toBe(2);
    expect((await keyRows(open, "k-expire")).filter((r) => !r.marker)).toHaveLength(1);
  });

  it("is dropped with its partition by the sweep once past retention", async () => {
    const now = new TestTime(Date.UTC(2031, 8, 1, 12));
    const s = await stores({ timeShift: now, retentionMs: DAY });
    const c = paymentClaim("acct_1", "k-sweep", "{}");
    expect((await s.runStatement(c, pay("sweep"))).kind).toBe("executed");
    const bucket = s.store.partitions.bucketOf(now.ms);
    now.ms += 3 * DAY;
    const { dropped } = await s.store.sweep();
    expect(dropped).toContain(bucket);
    expect(await keyRows(open, "k-sweep")).toEqual([]);
    expect((await s.runStatement(c, pay("sweep"))).kind).toBe("executed"); // a new key after the window
  });

  it("marks the previous partition in the first minutes of a new one, and replays across the boundary", async () => {
    const boundary = Date.UTC(2032, 7, 9);
    const before = await stores({ timeShift: new TestTime(boundary - 30_000) });
    const after = await stores({ timeShift: new TestTime(boundary + 30_000) });
    const c = paymentClaim("acct_1", "k-boundary", "{}");
    const b = before.store.partitions.bucketOf(boundary);
    const first = await after.runStatement(c, pay("boundary"));
    expect(first.kind).toBe("executed");
    expect(await keyRows(open, "k-boundary")).toEqual([
      { bucket: b - 1, marker: true },
      { bucket: b, marker: false },
    ]);
    // A retry placed before the boundary (another instance's clock does not matter: the database's
    // does, here moved back) still finds the row and replays it.
    const c2 = paymentClaim("acct_1", "k-boundary-2", "{}");
    expect((await before.runStatement(c2, pay("boundary-2"))).kind).toBe("executed");
    expect((await after.runStatement(c2, pay("boundary-2"))).kind).toBe("replayed");
    expect(await payments(open, "boundary")).toBe(1);
    expect(await payments(open, "boundary-2")).toBe(1);
  });

  // PGlite reads its clock from this process's Date.now: only a server can be days apart.
  it.skipIf(backend.name === "pglite")(
    "a process clock days off the database's still finds a key of an earlier partition: one charge",
    async () => {
      // The common statement names the lookup's partitions from this process's estimate of the
      // database's time; when they miss one, it declines (no lock, no work) and the full statement,
      // which reads by the database's clock alone, answers.
      const now = new TestTime(Date.UTC(2034, 4, 6, 23));
      const s = await stores({ timeShift: now });
      const c = paymentClaim("acct_1", "k-skewed", "{}");
      expect((await s.runStatement(c, pay("skewed"))).kind).toBe("executed");
      now.ms += 20 * HOUR; // the next daily partition, within the 24 h retention
      const realNow = Date.now.bind(Date);
      for (const offMs of [3 * DAY, -3 * DAY]) {
        const off = await stores({ timeShift: now }); // has not seen the key
        const clock = vi.spyOn(Date, "now").mockImplementation(() => realNow() + offMs);
        try {
          const again = await off.runStatement(c, pay("skewed"));
          expect(again.kind).toBe("replayed");
          const fresh = paymentClaim("acct_1", `k-skewed-${offMs}`, "{}");
          expect((await off.runStatement(fresh, pay("skewed-new"))).kind).toBe("executed");
          expect((await off.runStatement(fresh, pay("skewed-new"))).kind).toBe("replayed");
        } finally {
          clock.mockRestore();
        }
      }
      expect(await payments(open, "skewed")).toBe(1);
      expect(await payments(open, "skewed-new")).toBe(2);
    },
  );

  it("makes the partition of now when it is missing, and runs the statement once", async () => {
    const now = new TestTime(Date.UTC(2030, 0, 1));
    const s = await stores({ timeShift: now, retentionMs: DAY });
    now.ms += 5 * DAY; // past every partition made at open
    const c = paymentClaim("acct_1", "k-missing", "{}");
    expect((await s.runStatement(c, pay("missing"))).kind).toBe("executed");
    expect(await payments(open, "missing")).toBe(1);
  });

  it("answers duplicates in one process from memory and the statement: one execution", async () => {
    const c = paymentClaim("acct_1", "k-local-50", "{}");
    const outs = await Promise.all(Array.from({ length: 50 }, () => store.runStatement(c, pay("local-50"))));
    expect(outs.filter((o) => o.kind === "executed")).toHaveLength(1);
    expect(outs.filter((o) => o.kind === "replayed")).toHaveLength(49);
    expect(await payments(open, "local-50")).toBe(1);
  });

  it("hands a key that nothing finished to the next duplicate in this process, one at a time", async () => {
    // Each call changes nothing (so saves nothing): every duplicate waiting in memory gets the key in
    // turn and runs the statement itself, none answered 409 while another still holds it.
    const c = paymentClaim("acct_1", "k-handed", "{}");
    const outs = await Promise.all(Array.from({ length: 10 }, () => store.runStatement(c, CHANGES_NOTHING)));
    expect(outs.map((o) => [o.kind, o.response.status])).toEqual(
      Array.from({ length: 10 }, () => ["executed", 404]),
    );
    expect(await keyRows(open, "k-handed")).toEqual([]);
    // And the key is free afterwards: a statement that does change something runs and is saved.
    const done = await store.runStatement(c, pay("handed"));
    expect(done).toMatchObject({ kind: "executed", saved: true });
    expect(await payments(open, "handed")).toBe(1);
  });
});

describe.each(serverBackends)("single-statement races on $name", (backend) => {
  let open: OpenDb;

  beforeAll(async () => {
    open = await backend.open();
    await setUp(open);
  });
  afterAll(() => open.close());

  it("runs once under 50 concurrent duplicates from 50 stores (processes)", async () => {
    const many = await Promise.all(
      Array.from({ length: 50 }, async () => new SingleStatementStore(await PostgresStore.open(open.db))),
    );
    const c = paymentClaim("acct_1", "k-50", "{}");
    // A slow statement: every duplicate arrives while the first holds the key.
    const slow: StatementSpec = {
      ...pay("fifty"),
      sql: `INSERT INTO payments (note, amount_cents, claim_id)
            SELECT $1, $2, claim_id FROM idem_claim, pg_sleep(0.3) RETURNING id, note, amount_cents`,
    };
    const outs = await Promise.allSettled(many.map((s) => s.runStatement(c, slow)));
    const kinds = outs.map((o) => (o.status === "fulfilled" ? o.value.kind : "409"));
    expect(kinds.filter((k) => k === "executed")).toHaveLength(1);
    for (const o of outs) if (o.status === "rejected") expect(isKeyInFlightError(o.reason)).toBe(true);
    expect(await payments(open, "fifty")).toBe(1);
    const bodies = new Set(
      outs.flatMap((o) => (o.status === "fulfilled" ? [Buffer.from(o.value.response.body).toString()] : [])),
    );
    expect(bodies.size).toBe(1);
  });

  it("answers 409 with Retry-After past lockTimeoutMs while another process holds the key", async () => {
    const holder = new SingleStatementStore(await PostgresStore.open(open.db));
    const waiter = new SingleStatementStore(await PostgresStore.open(open.db, { lockTimeoutMs: 200 }));
    const c = paymentClaim("acct_1", "k-409", "{}");
    const slow: StatementSpec = {
      ...pay("held"),
      sql: `INSERT INTO payments (note, amount_cents, claim_id)
            SELECT $1, $2, claim_id FROM idem_claim, pg_sleep(1.5) RETURNING id, note, amount_cents`,
    };
    const first = holder.runStatement(c, slow);
    await new Promise((r) => setTimeout(r, 300));
    const err = await waiter.runStatement(c, pay("held")).catch((e: unknown) => e);
    expect(isKeyInFlightError(err)).toBe(true);
    expect((err as { retryAfterSeconds: number }).retryAfterSeconds).toBeGreaterThan(0);
    expect((await first).kind).toBe("executed");
    expect((await waiter.runStatement(c, pay("held"))).kind).toBe("replayed");
    expect(await payments(open, "held")).toBe(1);
  });

  /*
   * The race the lock cannot close: a duplicate A whose key row is not yet committed, and a statement B
   * that takes the lock anyway (A does not hold it here: as if A committed right after B's snapshot)
   * and whose row goes to the next partition. B's boundary marker meets A's row on the previous
   * partition's unique index: B waits for A, fails with 23505 (its payment rolled back), reads again
   * and replays A.
   */
  it("never runs twice across a partition boundary when the snapshot missed the other's row", async () => {
    const boundary = Date.UTC(2033, 2, 3);
    const after = new SingleStatementStore(
      await PostgresStore.open(open.db, { timeShift: new TestTime(boundary + 30_000) }),
    );
    const b = after.store.partitions.bucketOf(boundary);
    const c = paymentClaim("acct_1", "k-race", "{}");
    for (const commitA of [true, false]) {
      const key = `k-race-${commitA}`;
      const claim = { ...c, key };
      const pgmod = await import("pg");
      const client = new pgmod.default.Client({ connectionString: open.url });
      await client.connect();
      try {
        await client.query("BEGIN");
        await client.query(
          `INSERT INTO idem.keys (bucket, scope, key, fingerprint, created_at, recovery_point, status, headers, body)
           VALUES ($1, 'acct_1', $2, $3, to_timestamp($4 / 1000.0), 'done', 201, '[]', convert_to('{"from":"A"}', 'UTF8'))`,
          [b - 1, key, Buffer.from(c.fingerprint), boundary - 1_000],
        );
        const second = after.runStatement(claim, pay(`race-${commitA}`));
        await new Promise((r) => setTimeout(r, 300)); // B is waiting on A's row (its marker)
        await client.query(commitA ? "COMMIT" : "ROLLBACK");
        const out = await second;
        if (commitA) {
          expect(out.kind).toBe("replayed");
          expect(dec.decode(out.response.body)).toBe('{"from":"A"}');
          expect(await payments(open, `race-${commitA}`)).toBe(0);
        } else {
          expect(out.kind).toBe("executed");
          expect(await payments(open, `race-${commitA}`)).toBe(1);
        }
      } finally {
        await client.end();
      }
    }
  });

  it("keeps nothing of a statement whose connection was cut mid-way, and runs the retry once", async () => {
    const s = new SingleStatementStore(await PostgresStore.open(open.db));
    const c = paymentClaim("acct_1", "k-cut", "{}");
    const slow: StatementSpec = {
      ...pay("cut"),
      sql: `INSERT INTO payments (note, amount_cents, claim_id)
            SELECT $1, $2, claim_id FROM idem_claim, pg_sleep(2) RETURNING id, note, amount_cents`,
    };
    const first = s.runStatement(c, slow).catch((e: unknown) => e);
    let seen = 0;
    while (!seen) {
      await new Promise((r) => setTimeout(r, 50));
      const { rows } = await open.db.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()",
      );
      seen = rows[0]!.n;
    }
    // The server-side equivalent of kill -9 of the client: the backend running the statement dies.
    await open.db.query(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()",
    );
    expect(await first).toBeInstanceOf(Error);
    expect(await payments(open, "cut")).toBe(0);
    expect(await keyRows(open, "k-cut")).toEqual([]);
    expect((await s.runStatement(c, pay("cut"))).kind).toBe("executed");
    expect(await payments(open, "cut")).toBe(1);
  });
});
