/**
 * What a request costs the database, and what a duplicate waits for: a retry of a key this process saw
 * finished is one read without a transaction; a new key, an expired one, a retry of an unsaved answer
 * or of a compact key (rebuilt in its transaction) is one transaction and no read; a duplicate in the
 * same process waits in memory, touching nothing, and another key never waits for it. Counted through a `Db` of the user's own making (a thin wrapper
 * over the real driver that implements no optional hint), on every backend; the waits across
 * connections on the real server only (PGlite has one connection).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Claim, isKeyInFlightError, type StoredResponse } from "../../src/core/index.ts";
import type { Db, Tx } from "../../src/postgres/db.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore, type PostgresStoreOptions } from "../../src/postgres/store.ts";
import { paymentClaim } from "../helpers/claim.ts";
import { backends, type OpenDb, serverBackends } from "../helpers/db.ts";
import { latch } from "../helpers/latch.ts";
import { TestTime } from "../helpers/time.ts";

const enc = new TextEncoder();
const HOUR = 3_600_000;

const claimOf = (key: string): Claim => paymentClaim("acct_cost", key, '{"amount_cents":700}');

async function charge(tx: Tx, status = 201) {
  const { rows } = await tx.query<{ id: number }>("INSERT INTO effects DEFAULT VALUES RETURNING id");
  const response: StoredResponse = {
    status,
    headers: [["content-type", "application/json"]],
    body: enc.encode(JSON.stringify({ id: rows[0]!.id })),
  };
  return { response, save: status < 300 ? response : undefined };
}

const mustNotRun = async (): Promise<never> => {
  throw new Error("the work must not run");
};

/** A user's own `Db` over the real one: counts reads outside a transaction, and transactions. */
function counting(db: Db) {
  const seen = { reads: 0, transactions: 0 };
  const wrapped: Db = {
    driver: "counting",
    query<R>(sql: string, params?: readonly unknown[]) {
      seen.reads++;
      return db.query<R>(sql, params);
    },
    exec: (sql) => db.exec(sql),
    close: async () => {},
    transaction(fn, options) {
      seen.transactions++;
      return db.transaction(
        (tx) =>
          fn({
            raw: tx.raw,
            pipelined: tx.pipelined,
            query: (sql, params) => tx.query(sql, params),
            exec: (sql) => tx.exec(sql),
            final: (sql, params) => tx.final(sql, params),
          }),
        options,
      );
    },
  };
  const reset = () => {
    seen.reads = 0;
    seen.transactions = 0;
  };
  return { db: wrapped, seen, reset };
}

function deferred() {
  const [promise, resolve] = latch();
  return { promise, resolve };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe.each(backends)("what a request costs, on $name", (backend) => {
  let open: OpenDb;
  const now = new TestTime(Date.UTC(2031, 6, 1, 9));
  const stores = async (options: PostgresStoreOptions = {}) => {
    const c = counting(open.db);
    const store = await PostgresStore.open(c.db, { timeShift: now, retentionMs: 6 * HOUR, ...options });
    c.reset();
    return { store, ...c };
  };

  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db, { partitionSeconds: 3_600 });
    await open.db.exec("CREATE TABLE effects (id serial PRIMARY KEY)");
  });
  afterAll(async () => {
    await open?.close();
  });

  it("a new key is one transaction; a retry of it is answered from one read, without a transaction", async () => {
    const { store, seen, reset } = await stores();
    const c = claimOf("k-one-read");
    const first = await store.atomic(c, (tx) => charge(tx));
    expect(first.kind).toBe("executed");
    expect(seen).toEqual({ reads: 0, transactions: 1 });
    for (let i = 0; i < 3; i++) {
      reset();
      const again = await store.atomic(c, mustNotRun);
      expect(again.kind).toBe("replayed");
      expect(Buffer.from(again.response.body)).toEqual(Buffer.from(first.response.body));
      expect(seen).toEqual({ reads: 1, transactions: 0 });
    }
  });

  it("a store that replayed another instance's key answers its next retry from one read", async () => {
    const a = await stores();
    const b = await stores();
    const c = claimOf("k-other-instance");
    const first = await a.store.atomic(c, (tx) => charge(tx));
    // b has seen nothing: its first retry takes the locked path (on a driver without `readOnlyDone`).
    const replay = await b.store.atomic(c, mustNotRun);
    expect(replay.kind).toBe("replayed");
    expect(b.seen).toEqual({ reads: 0, transactions: 1 });
    b.reset();
    const again = await b.store.atomic(c, mustNotRun);
    expect(Buffer.from(again.response.body)).toEqual(Buffer.from(first.response.body));
    expect(b.seen).toEqual({ reads: 1, transactions: 0 });
  });

  it("a retry of an answer that was not saved (a 503) runs again in one transaction, with no read first", async () => {
    const { store, seen, reset } = await stores();
    const c = claimOf("k-unsaved");
    expect(await store.atomic(c, (tx) => charge(tx, 503))).toMatchObject({ kind: "executed", saved: false });
    reset();
    expect(await store.atomic(c, (tx) => charge(tx))).toMatchObject({ kind: "executed", saved: true });
    expect(seen).toEqual({ reads: 0, transactions: 1 });
  });

  it("a retry of a compact key is rebuilt in one transaction, with no read first", async () => {
    const { store, seen, reset } = await stores();
    const c = claimOf("k-compact");
    const rebuild = async (saved: { status: number; id: string }): Promise<StoredResponse> => ({
      status: saved.status,
      headers: [],
      body: enc.encode(saved.id),
    });
    const first = await store.atomic(
      c,
      async (tx) => {
        const r = await charge(tx);
        return { ...r, compactId: "pay_1" };
      },
      { rebuild },
    );
    expect(first).toMatchObject({ kind: "executed", saved: true });
    for (let i = 0; i < 2; i++) {
      reset();
      const again = await store.atomic(c, mustNotRun, { rebuild });
      expect(again.kind).toBe("replayed");
      expect(new TextDecoder().decode(again.response.body)).toBe("pay_1");
      expect(seen).toEqual({ reads: 0, transactions: 1 });
    }
  });

  it("an expired key runs again past its expiry, in one transaction, though this store saw it finished", async () => {
    const { store, seen, reset } = await stores({ retentionMs: HOUR }); // expires in a partition made at open
    const c = claimOf("k-expired");
    const first = await store.atomic(c, (tx) => charge(tx));
    expect((await store.atomic(c, mustNotRun)).kind).toBe("replayed");
    const before = now.ms;
    now.ms = first.expiresAt.getTime() + 1_000;
    try {
      reset();
      expect(await store.atomic(c, (tx) => charge(tx))).toMatchObject({ kind: "executed", saved: true });
      expect(seen).toEqual({ reads: 0, transactions: 1 });
    } finally {
      now.ms = before;
    }
  });

  it("a duplicate in the same process waits in memory, then is answered from one read", async () => {
    const { store, seen, reset } = await stores();
    const c = claimOf("k-in-memory");
    const go = deferred();
    const running = deferred();
    const first = store.atomic(c, async (tx) => {
      const r = await charge(tx);
      running.resolve();
      await go.promise;
      return r;
    });
    await running.promise;
    reset();
    const dup = store.atomic(c, mustNotRun);
    await sleep(150);
    expect(seen).toEqual({ reads: 0, transactions: 0 }); // nothing asked of the database meanwhile
    go.resolve();
    const [a, b] = await Promise.all([first, dup]);
    expect(b.kind).toBe("replayed");
    expect(Buffer.from(b.response.body)).toEqual(Buffer.from(a.response.body));
    expect(seen).toEqual({ reads: 1, transactions: 0 });
  });

  it("retries of a finished key that come together share one read: none waits behind another", async () => {
    const { store, seen, reset } = await stores();
    const c = claimOf("k-hot");
    const first = await store.atomic(c, (tx) => charge(tx));
    reset();
    const replays = await Promise.all(Array.from({ length: 16 }, () => store.atomic(c, mustNotRun)));
    for (const r of replays) {
      expect(r.kind).toBe("replayed");
      expect(Buffer.from(r.response.body)).toEqual(Buffer.from(first.response.body));
    }
    // One read answers all 16 (queued one behind another, there would be 16, one at a time).
    expect(seen).toEqual({ reads: 1, transactions: 0 });
    // A retry that comes after that read settled reads again: nothing is kept.
    await store.atomic(c, mustNotRun);
    expect(seen).toEqual({ reads: 2, transactions: 0 });
  });

  it("duplicates waiting in memory share one read of the replay once the first finishes", async () => {
    const { store, seen, reset } = await stores();
    const c = claimOf("k-many-waiting");
    const go = deferred();
    const running = deferred();
    const first = store.atomic(c, async (tx) => {
      const r = await charge(tx);
      running.resolve();
      await go.promise;
      return r;
    });
    await running.promise;
    reset();
    const dups = Array.from({ length: 8 }, () => store.atomic(c, mustNotRun));
    await sleep(50);
    expect(seen).toEqual({ reads: 0, transactions: 0 });
    go.resolve();
    const answers = await Promise.all(dups);
    expect(answers.map((a) => a.kind)).toEqual(Array(8).fill("replayed"));
    expect((await first).kind).toBe("executed");
    expect(seen).toEqual({ reads: 1, transactions: 0 });
  });

  it("when the first answer is not saved, one waiting duplicate runs the work and the others replay it", async () => {
    const { store, seen, reset } = await stores();
    const c = claimOf("k-handed-over");
    const go = deferred();
    const running = deferred();
    const first = store.atomic(c, async (tx) => {
      const r = await charge(tx, 503);
      running.resolve();
      await go.promise;
      return r;
    });
    await running.promise;
    reset();
    let runs = 0;
    const dups = Array.from({ length: 4 }, () =>
      store.atomic(c, (tx) => {
        runs++;
        return charge(tx);
      }),
    );
    go.resolve();
    expect(await first).toMatchObject({ kind: "executed", saved: false });
    const answers = await Promise.all(dups);
    expect(runs).toBe(1);
    expect(answers.filter((a) => a.kind === "executed")).toHaveLength(1);
    expect(answers.filter((a) => a.kind === "replayed")).toHaveLength(3);
    expect(seen.transactions).toBe(1); // the others never opened one
  });
});

describe.each(serverBackends)("duplicates and other keys under concurrency, on $name", (backend) => {
  let open: OpenDb;
  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
    await open.db.exec("CREATE TABLE effects (id serial PRIMARY KEY)");
  });
  afterAll(async () => {
    await open?.close();
  });

  it("a request under another key does not wait for a slow one", async () => {
    const store = await PostgresStore.open(open.db, { lockTimeoutMs: 200 });
    const go = deferred();
    const running = deferred();
    const slow = store.atomic(claimOf("k-slow"), async (tx) => {
      const r = await charge(tx);
      running.resolve();
      await go.promise;
      return r;
    });
    await running.promise;
    try {
      const other = await store.atomic(claimOf("k-not-slow"), (tx) => charge(tx));
      expect(other).toMatchObject({ kind: "executed", saved: true });
    } finally {
      go.resolve();
    }
    expect((await slow).kind).toBe("executed");
  });

  it("a store that may not wait (lockTimeoutMs 0) answers a duplicate 409 at once", async () => {
    const store = await PostgresStore.open(open.db, { lockTimeoutMs: 0 });
    const c = claimOf("k-no-wait");
    const go = deferred();
    const running = deferred();
    const first = store.atomic(c, async (tx) => {
      const r = await charge(tx);
      running.resolve();
      await go.promise;
      return r;
    });
    await running.promise;
    try {
      const err = await store.atomic(c, mustNotRun).catch((e: unknown) => e);
      expect(isKeyInFlightError(err)).toBe(true);
    } finally {
      go.resolve();
    }
    expect((await first).kind).toBe("executed");
  });
  it("a duplicate from another process gets its replay soon after the first finishes, not at the end of its wait", async () => {
    const a = await PostgresStore.open(open.db);
    const b = await PostgresStore.open(open.db, { lockTimeoutMs: 4_000 });
    const c = claimOf("k-prompt");
    const running = deferred();
    const first = a.atomic(c, async (tx) => {
      const r = await charge(tx);
      running.resolve();
      await sleep(200);
      return r;
    });
    await running.promise;
    const t = performance.now();
    const dup = await b.atomic(c, mustNotRun);
    const waited = performance.now() - t;
    expect(dup.kind).toBe("replayed");
    expect(Buffer.from(dup.response.body)).toEqual(Buffer.from((await first).response.body));
    expect(waited).toBeLessThan(2_000);
  });
});
