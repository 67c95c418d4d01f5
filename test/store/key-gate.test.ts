/**
 * The key gate (src/postgres/keys/gate.ts), which every mode passes: a duplicate of a key held by
 * another process waits for it, and is answered 409 once it has waited `lockTimeoutMs` by the
 * database's clock, never by this process's. Two stores stand for two processes (the second cannot
 * wait in memory: it polls the key); both read one clock, which the test moves with a shared time
 * shift while the duplicate waits. On the real server only: PGlite has one connection, so a second
 * process's duplicate would queue for it rather than meet the key.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isKeyInFlightError, type StoredResponse } from "../../src/core/index.ts";
import type { Tx } from "../../src/postgres/db.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { SingleStatementStore, type StatementSpec } from "../../src/postgres/statement/store.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { paymentClaim } from "../helpers/claim.ts";
import { type OpenDb, sayWhySkippedWithoutServer, serverBackends } from "../helpers/db.ts";
import { latch } from "../helpers/latch.ts";
import { TestTime } from "../helpers/time.ts";

const enc = new TextEncoder();
/** Far longer than the test may take: a duplicate that waits it out fails the test by its timeout. */
const LONG_WAIT_MS = 60_000;

async function charge(tx: Tx, note: string): Promise<{ response: StoredResponse; save: StoredResponse }> {
  await tx.query("INSERT INTO gate_effects (note) VALUES ($1)", [note]);
  const response: StoredResponse = { status: 201, headers: [], body: enc.encode(note) };
  return { response, save: response };
}

async function effects(open: OpenDb, note: string): Promise<number> {
  const { rows } = await open.db.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM gate_effects WHERE note = $1",
    [note],
  );
  return rows[0]!.n;
}

async function setUp(open: OpenDb): Promise<void> {
  await migrate(open.db);
  await open.db.exec(
    "CREATE TABLE gate_effects (id serial PRIMARY KEY, note text NOT NULL, amount_cents int, claim_id uuid)",
  );
}

sayWhySkippedWithoutServer();

describe.each(serverBackends)("the key gate in atomic mode on $name", (backend) => {
  let open: OpenDb;
  beforeAll(async () => {
    open = await backend.open();
    await setUp(open);
  });
  afterAll(() => open.close());

  it("answers a waiting duplicate 409 once the database's clock passed its wait bound", async () => {
    const now = new TestTime();
    const holder = await PostgresStore.open(open.db, { timeShift: now });
    const waiter = await PostgresStore.open(open.db, { timeShift: now, lockTimeoutMs: LONG_WAIT_MS });
    const c = paymentClaim("acct_1", "k-gate-atomic", "{}");
    const [gate, release] = latch();
    const [holding, running] = latch();
    const first = holder.atomic(c, async (tx) => {
      const r = await charge(tx, "gate-atomic");
      running(); // the key's lock is held until the gate opens
      await gate;
      return r;
    });
    await holding;
    const started = performance.now();
    const duplicate = waiter.atomic(c, (tx) => charge(tx, "gate-atomic")).catch((e: unknown) => e);
    await new Promise((r) => setTimeout(r, 300));
    // A minute on by the database's clock; this process's clock has moved 300 ms.
    now.ms += LONG_WAIT_MS + 1_000;
    const err = await duplicate;
    expect(isKeyInFlightError(err)).toBe(true);
    expect(performance.now() - started).toBeLessThan(5_000);
    release();
    expect((await first).kind).toBe("executed");
    expect((await waiter.atomic(c, (tx) => charge(tx, "gate-atomic"))).kind).toBe("replayed");
    expect(await effects(open, "gate-atomic")).toBe(1);
  });
});

describe.each(serverBackends)("the key gate in single-statement mode on $name", (backend) => {
  let open: OpenDb;
  beforeAll(async () => {
    open = await backend.open();
    await setUp(open);
  });
  afterAll(() => open.close());

  const pay = (note: string, sleepS = 0): StatementSpec => ({
    sql: `INSERT INTO gate_effects (note, amount_cents, claim_id)
          SELECT $1, 500, claim_id FROM idem_claim${sleepS ? `, pg_sleep(${sleepS})` : ""} RETURNING id, note`,
    params: [note],
    status: 201,
  });

  it("answers a waiting duplicate 409 once the database's clock passed its wait bound", async () => {
    const now = new TestTime();
    const holder = new SingleStatementStore(await PostgresStore.open(open.db, { timeShift: now }));
    const waiter = new SingleStatementStore(
      await PostgresStore.open(open.db, { timeShift: now, lockTimeoutMs: LONG_WAIT_MS }),
    );
    const c = paymentClaim("acct_1", "k-gate-statement", "{}");
    const first = holder.runStatement(c, pay("gate-statement", 4)); // holds the key 4 s
    await new Promise((r) => setTimeout(r, 300));
    const started = performance.now();
    const duplicate = waiter.runStatement(c, pay("gate-statement")).catch((e: unknown) => e);
    await new Promise((r) => setTimeout(r, 300));
    now.ms += LONG_WAIT_MS + 1_000;
    const err = await duplicate;
    expect(isKeyInFlightError(err)).toBe(true);
    // Answered while the holder still runs: the bound, not the holder's end, ended the wait.
    expect(performance.now() - started).toBeLessThan(3_000);
    expect((await first).kind).toBe("executed");
    expect((await waiter.runStatement(c, pay("gate-statement"))).kind).toBe("replayed");
    expect(await effects(open, "gate-statement")).toBe(1);
  });
});
