/**
 * Work sent with the claim (`effectsInTxOnly`, the store's `speculate`) and the finished-key hint: on
 * the pg pipeline driver the handler's first statement leaves with BEGIN, the lock and the lookup, and
 * must roll back whenever the key turns out to be taken. Every backend must give the same answers
 * (PGlite and postgres.js run it without speculation) and execute each key once.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  AbandonedWorkError,
  type Claim,
  isKeyInFlightError,
  isKeyMismatchError,
  RetryableError,
  type StoredResponse,
} from "../../src/core/index.ts";
import type { Db, Tx } from "../../src/postgres/db.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { paymentClaim } from "../helpers/claim.ts";
import { backends, type OpenDb, serverBackends, type TestBackend } from "../helpers/db.ts";
import { latch } from "../helpers/latch.ts";
import { TestTime } from "../helpers/time.ts";

const enc = new TextEncoder();
const speculate = { speculate: true };
const DAY = 86_400_000;

const claimOf = (key: string, body = '{"amount_cents":5000}'): Claim => paymentClaim("acct_spec", key, body);

async function charge(tx: Tx, note: string) {
  const { rows } = await tx.query<{ id: number }>("INSERT INTO effects (note) VALUES ($1) RETURNING id", [
    note,
  ]);
  const response: StoredResponse = {
    status: 201,
    headers: [["content-type", "application/json"]],
    body: enc.encode(JSON.stringify({ id: rows[0]!.id, note })),
  };
  return { response, save: response };
}

async function count(db: Db, note: string): Promise<number> {
  const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM effects WHERE note = $1", [
    note,
  ]);
  return rows[0]!.n;
}

/** A migrated database of its own with an `effects` table, for the tests of one describe block. */
function effectsDb(backend: TestBackend): OpenDb {
  const open = {} as OpenDb;
  beforeAll(async () => {
    Object.assign(open, await backend.open());
    await migrate(open.db);
    await open.db.exec("CREATE TABLE effects (id serial PRIMARY KEY, note text NOT NULL)");
  });
  afterAll(async () => {
    await open.close?.();
  });
  return open;
}

describe.each(backends)("work sent with the claim, on $name", (backend) => {
  const open = effectsDb(backend);

  it("runs a new key once, and a retry on another instance replays it and rolls its work back", async () => {
    const a = await PostgresStore.open(open.db);
    const b = await PostgresStore.open(open.db); // another process: it has seen nothing finished
    const c = claimOf("k-first");
    const first = await a.atomic(c, (tx) => charge(tx, "first"), speculate);
    expect(first.kind).toBe("executed");
    let abandoned: unknown;
    const again = await b.atomic(
      c,
      (tx) =>
        charge(tx, "first").catch((err) => {
          abandoned = err;
          throw err;
        }),
      speculate,
    );
    expect(again.kind).toBe("replayed");
    expect(Buffer.from(again.response.body)).toEqual(Buffer.from(first.response.body));
    expect(await count(open.db, "first")).toBe(1);
    // On the pipelining driver the work was started before the lookup answered, and told why its
    // statement failed; the others looked the key up first and never started it.
    if (backend.name === "pg") expect(abandoned).toBeInstanceOf(AbandonedWorkError);
    else expect(abandoned).toBeUndefined();
  });

  it("answers another request under a taken key 422 and keeps none of its statements", async () => {
    const a = await PostgresStore.open(open.db);
    const b = await PostgresStore.open(open.db);
    await a.atomic(claimOf("k-mismatch"), (tx) => charge(tx, "mismatch"), speculate);
    const err = await b
      .atomic(claimOf("k-mismatch", '{"amount_cents":9999}'), (tx) => charge(tx, "mismatch-2"), speculate)
      .catch((e) => e);
    expect(isKeyMismatchError(err)).toBe(true);
    expect(await count(open.db, "mismatch")).toBe(1);
    expect(await count(open.db, "mismatch-2")).toBe(0);
  });

  it("rejects every later statement of an abandoned work, even one that caught the first error", async () => {
    const a = await PostgresStore.open(open.db);
    const b = await PostgresStore.open(open.db);
    await a.atomic(claimOf("k-stubborn"), (tx) => charge(tx, "stubborn"), speculate);
    const out = await b.atomic(
      claimOf("k-stubborn"),
      async (tx) => {
        await tx.query("INSERT INTO effects (note) VALUES ('stubborn-1')").catch(() => {});
        return charge(tx, "stubborn-2");
      },
      speculate,
    );
    expect(out.kind).toBe("replayed");
    expect(await count(open.db, "stubborn-1")).toBe(0);
    expect(await count(open.db, "stubborn-2")).toBe(0);
  });

  it("takes the locked path again when a key it saw finished is gone (the hint is only a hint)", async () => {
    const a = await PostgresStore.open(open.db);
    const c = claimOf("k-gone");
    await a.atomic(c, (tx) => charge(tx, "gone"), speculate);
    expect((await a.atomic(c, (tx) => charge(tx, "gone"), speculate)).kind).toBe("replayed");
    // As if its partition had been dropped by a sweep: the key is new again.
    await open.db.query("DELETE FROM idem.keys WHERE scope = $1 AND key = $2", [c.scope, c.key]);
    const rerun = await a.atomic(c, (tx) => charge(tx, "gone"), speculate);
    expect(rerun.kind).toBe("executed");
    expect(await count(open.db, "gone")).toBe(2);
  });
  it("a route without effectsInTxOnly never starts its handler for a key another instance finished", async () => {
    const a = await PostgresStore.open(open.db);
    const b = await PostgresStore.open(open.db);
    const c = claimOf("k-not-speculative");
    await a.atomic(c, (tx) => charge(tx, "not-speculative"));
    let started = 0;
    const again = await b.atomic(c, (tx) => {
      started++;
      return charge(tx, "not-speculative");
    });
    expect(again.kind).toBe("replayed");
    expect(started).toBe(0);
    expect(await count(open.db, "not-speculative")).toBe(1);
  });

  it("the handler's own error comes out unchanged, and none of its statements are kept", async () => {
    const a = await PostgresStore.open(open.db);
    const boom = new Error("card network down");
    const err = await a
      .atomic(
        claimOf("k-own-error"),
        async (tx) => {
          await charge(tx, "own-error");
          throw boom;
        },
        speculate,
      )
      .catch((e: unknown) => e);
    expect(err).toBe(boom);
    expect(await count(open.db, "own-error")).toBe(0);
  });

  it("the handler's transaction is the driver's: tx.raw, tx.pipelined and tx.exec work as without it", async () => {
    const a = await PostgresStore.open(open.db);
    const plain = await open.db.transaction(async (tx) => ({ raw: typeof tx.raw, pipelined: tx.pipelined }));
    let seen: unknown;
    const out = await a.atomic(
      claimOf("k-exec"),
      async (tx) => {
        seen = { raw: typeof tx.raw, pipelined: tx.pipelined };
        await tx.exec("INSERT INTO effects (note) VALUES ('exec')");
        return charge(tx, "exec-charge");
      },
      speculate,
    );
    expect(out).toMatchObject({ kind: "executed", saved: true });
    expect(seen).toEqual(plain);
    expect(plain.raw).not.toBe("undefined");
    expect(await count(open.db, "exec")).toBe(1);
  });

  it("a save that meets a missing partition rolls the handler's writes back and asks for a retry", async () => {
    await migrate(open.db, { schema: "spec_dropped" });
    const now = Date.UTC(2032, 3, 1, 12);
    const a = await PostgresStore.open(open.db, { schema: "spec_dropped", timeShift: new TestTime(now) });
    // A sweep three days later drops the partitions a made at open (a's time is held back): the key
    // row's INSERT then fails (23514), after the handler's statements ran.
    const sweeper = await PostgresStore.open(open.db, {
      schema: "spec_dropped",
      timeShift: new TestTime(now + 3 * DAY),
    });
    expect((await sweeper.sweep()).dropped).toContain(a.partitions.bucketOf(now));
    const c = claimOf("k-far");
    const refused = await a.atomic(c, (tx) => charge(tx, "far"), speculate).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(RetryableError);
    expect(await count(open.db, "far")).toBe(0);
    const first = await a.atomic(c, (tx) => charge(tx, "far"), speculate);
    expect(first).toMatchObject({ kind: "executed", saved: true });
    expect(await count(open.db, "far")).toBe(1);
    const again = await a.atomic(c, (tx) => charge(tx, "far"), speculate);
    expect(again.kind).toBe("replayed");
    expect(Buffer.from(again.response.body)).toEqual(Buffer.from(first.response.body));
    expect(await count(open.db, "far")).toBe(1);
  });
});

describe.each(serverBackends)("a key held by another process, on $name", (backend) => {
  const open = effectsDb(backend);

  it("answers 409 while the first runs, then replays it; the key's work ran once", async () => {
    const a = await PostgresStore.open(open.db);
    const b = await PostgresStore.open(open.db, { lockTimeoutMs: 300 });
    const c = claimOf("k-held");
    const [gate, release] = latch();
    const first = a.atomic(
      c,
      async (tx) => {
        const r = await charge(tx, "held");
        await gate;
        return r;
      },
      speculate,
    );
    await new Promise((r) => setTimeout(r, 100)); // a holds the key's lock now
    const busy = await b.atomic(c, (tx) => charge(tx, "held"), speculate).catch((e) => e);
    expect(isKeyInFlightError(busy)).toBe(true);
    release();
    expect((await first).kind).toBe("executed");
    const later = await b.atomic(c, (tx) => charge(tx, "held"), speculate);
    expect(later.kind).toBe("replayed");
    expect(await count(open.db, "held")).toBe(1);
  });

  it("a duplicate that waited for the first, which then failed, runs its handler once", async () => {
    const a = await PostgresStore.open(open.db);
    const b = await PostgresStore.open(open.db, { lockTimeoutMs: 3_000 });
    const c = claimOf("k-after-failure");
    const [gate, release] = latch();
    const [holding, running] = latch();
    const first = a
      .atomic(c, async (tx) => {
        await charge(tx, "after-failure-first");
        running();
        await gate;
        throw new Error("first crashed");
      })
      .catch((e: Error) => e.message);
    await holding;
    let started = 0;
    const second = b.atomic(
      c,
      (tx) => {
        started++;
        return charge(tx, "after-failure");
      },
      speculate,
    );
    await new Promise((r) => setTimeout(r, 150)); // b finds the key's lock busy, several times
    release();
    expect(await first).toBe("first crashed");
    expect(await second).toMatchObject({ kind: "executed", saved: true });
    expect(started).toBe(1);
    expect(await count(open.db, "after-failure")).toBe(1);
    expect(await count(open.db, "after-failure-first")).toBe(0);
  });

  it("a duplicate answered 409 while its handler waited for the key: the handler's error path ends first", async () => {
    const a = await PostgresStore.open(open.db);
    const b = await PostgresStore.open(open.db, { lockTimeoutMs: 300 });
    const c = claimOf("k-told");
    const [gate, release] = latch();
    const [holding, running] = latch();
    const first = a.atomic(c, async (tx) => {
      const r = await charge(tx, "told");
      running();
      await gate;
      return r;
    });
    await holding;
    let told: unknown;
    let ended = false;
    const busy = await b
      .atomic(
        c,
        (tx) =>
          charge(tx, "told").catch(async (err) => {
            told = err;
            await new Promise((r) => setTimeout(r, 100)); // the adapter's error path
            ended = true;
            throw err;
          }),
        speculate,
      )
      .catch((e) => e);
    expect(isKeyInFlightError(busy)).toBe(true);
    // On the pipelining driver the handler was started and waited for the key; the others never started it.
    if (backend.name === "pg") {
      expect(told).toBeInstanceOf(AbandonedWorkError);
      expect(ended).toBe(true);
    } else expect(told).toBeUndefined();
    release();
    expect((await first).kind).toBe("executed");
    expect(await count(open.db, "told")).toBe(1);
  });

  it("runs 20 concurrent duplicates from two processes once", async () => {
    const a = await PostgresStore.open(open.db);
    const b = await PostgresStore.open(open.db);
    const c = claimOf("k-storm");
    const outs = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        (i % 2 ? a : b).atomic(c, (tx) => charge(tx, "storm"), speculate).catch((e) => e),
      ),
    );
    const bodies = new Set(
      outs.filter((o) => !(o instanceof Error)).map((o) => Buffer.from(o.response.body).toString()),
    );
    expect(bodies.size).toBe(1);
    expect(await count(open.db, "storm")).toBe(1);
  });
});
