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
  fingerprint,
  isKeyInFlightError,
  isKeyMismatchError,
  type StoredResponse,
} from "../../src/core/index.ts";
import type { Db, Tx } from "../../src/postgres/db.ts";
import { migrate } from "../../src/postgres/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { backends, type OpenDb, serverBackends, type TestBackend } from "../helpers/db.ts";

const enc = new TextEncoder();
const speculate = { speculate: true };

function claimOf(key: string, body = '{"amount_cents":5000}'): Claim {
  return {
    scope: "acct_spec",
    key,
    fingerprint: fingerprint({
      method: "POST",
      path: "/v1/payments",
      contentType: "application/json",
      body: enc.encode(body),
    }),
  };
}

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
});

describe.each(serverBackends)("a key held by another process, on $name", (backend) => {
  const open = effectsDb(backend);

  it("answers 409 while the first runs, then replays it; the key's work ran once", async () => {
    const a = await PostgresStore.open(open.db);
    const b = await PostgresStore.open(open.db, { lockTimeoutMs: 300 });
    const c = claimOf("k-held");
    let release!: () => void;
    const gate = new Promise<void>((r) => {
      release = r;
    });
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
