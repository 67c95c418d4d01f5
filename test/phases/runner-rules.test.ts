/**
 * The phases runner's rules, one by one, with phases written in the test (no provider simulator): what a
 * definition may not be, which answers are saved, where a key goes next and with what data, how a lost
 * lease fences the old worker, how takeovers, lookups and reviews go, and which failures come back as
 * retryable. Fast, so that `npm run mutate` can run it once per mutant.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  type Claim,
  fingerprint,
  isKeyInFlightError,
  isKeyMismatchError,
  isLeaseLostError,
  isOperationUncertainError,
  isRetryableError,
  KeyInFlightError,
  RetryableError,
  type StoredResponse,
} from "../../src/core/index.ts";
import type { Db } from "../../src/postgres/db.ts";
import {
  definePhases,
  jsonResponse,
  openReviews,
  type Phase,
  type PhaseFaults,
  type PhasesOptions,
  SimulatedCrashError,
} from "../../src/postgres/phases/index.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import type { OpenDb } from "../helpers/db.ts";
import { latch } from "../helpers/latch.ts";
import { TestTime } from "../helpers/time.ts";
import { deferred, serverOrEmbedded } from "./helpers.ts";

const enc = new TextEncoder();
const dec = new TextDecoder();
const LEASE = 30_000;
const RETENTION = 24 * 3_600_000;
type D = Record<string, unknown>;

let seq = 0;
const newKey = () => `k${Date.now().toString(36)}${seq++}`;
const claimOf = (key: string, body = "{}"): Claim => ({
  scope: "acct",
  key,
  fingerprint: fingerprint({
    method: "POST",
    path: "/v1/things",
    contentType: "application/json",
    body: enc.encode(body),
  }),
});
const text = (r: StoredResponse) => dec.decode(r.body);
const ok = (body: unknown = { ok: true }) => jsonResponse(201, body, [["x-charge", "ch_1"]]);

async function rejection(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  throw new Error("expected a rejection");
}

describe.each(serverOrEmbedded)("phases runner rules on $name", (backend) => {
  let open: OpenDb;
  let db: Db;
  let store: PostgresStore;
  const now = new TestTime(Date.UTC(2031, 2, 3, 12, 30));
  const define = (phases: Record<string, Phase<D, D>>, o: Partial<PhasesOptions<D, D>> = {}) =>
    definePhases<D, D>({
      store,
      name: "rules",
      leaseMs: LEASE,
      heartbeatMs: 0,
      answerWithinMs: Number.POSITIVE_INFINITY,
      phases,
      ...o,
    });
  /**
   * Three runners on `on`, one per racer, as three processes would have: one runner makes its own
   * duplicates wait in memory, so only separate runners race in the database.
   */
  const racers = (on: PostgresStore, phases: Record<string, Phase<D, D>>) =>
    Array.from({ length: 3 }, () => defineOn(on, phases));
  /** A runner on another store than `store` (one whose database a test wraps). */
  const defineOn = (on: PostgresStore, phases: Record<string, Phase<D, D>>) =>
    definePhases<D, D>({
      store: on,
      name: "rules",
      heartbeatMs: 0,
      answerWithinMs: Number.POSITIVE_INFINITY,
      phases,
    });
  const inspect = (key: string) => store.inspect("acct", key);
  /** The test database, where the first `n` statements matching `match` wait for each other's answers. */
  const barrierDb = (n: number, match: (sql: string) => boolean) => {
    let arrived = 0;
    const [all, release] = latch();
    setTimeout(() => release(), 2_000).unref();
    const proxied = new Proxy(db, {
      get(target, prop, receiver) {
        if (prop === "query") {
          return async (sql: string, params?: unknown[]) => {
            const res = await target.query(sql, params);
            if (match(sql) && arrived < n) {
              if (++arrived === n) release();
              await all;
            }
            return res;
          };
        }
        return Reflect.get(target, prop, receiver);
      },
    });
    return { db: proxied, arrived: () => arrived, all };
  };
  const effects = async (key: string) =>
    (await db.query<{ n: number }>("SELECT count(*)::int AS n FROM effects WHERE key = $1", [key])).rows[0]!
      .n;
  /** A fault that crashes once at `point`. */
  const crashOnceAt = (point: string): PhaseFaults => {
    let done = false;
    return {
      at: ({ point: p }) => {
        if (done || p !== point) return false;
        done = true;
        return true;
      },
    };
  };

  beforeAll(async () => {
    open = await backend.open();
    db = open.db;
    await migrate(db);
    await db.exec("CREATE TABLE effects (id serial PRIMARY KEY, key text NOT NULL, what text)");
    store = await PostgresStore.open(db, { timeShift: now, retentionMs: RETENTION, lockTimeoutMs: 200 });
  });
  afterAll(() => open?.close());

  describe("definitions", () => {
    it("refuses a runner without phases, with a phase named done, or naming phases that do not exist", () => {
      const local = { local: async () => ({ response: ok() }) };
      expect(() => define({})).toThrow("definePhases: give at least one phase");
      expect(() => define({ done: local })).toThrow('definePhases: "done" is reserved');
      expect(() => define({ a: local }, { first: "b" })).toThrow('definePhases: no phase named "b"');
      expect(() => define({ a: { ...local, next: "c" } })).toThrow(
        'definePhases: phase "a" goes on to "c", which is not a phase',
      );
      expect(define({ a: { ...local, next: "b" }, b: local }, { first: "b" }).first).toBe("b");
    });

    it("defaults: a 10 s lease renewed every 3.3 s, a 5 s answer bound, the first phase listed", () => {
      const r = definePhases({ store, name: "defaults", phases: { one: { local: async () => undefined } } });
      expect([r.leaseMs, r.heartbeatMs, r.answerWithinMs, r.first]).toEqual([10_000, 3_333, 5_000, "one"]);
      const s = definePhases({
        store,
        name: "x",
        leaseMs: 900,
        phases: { one: { local: async () => undefined } },
      });
      expect(s.heartbeatMs).toBe(300);
    });
  });

  describe("answers", () => {
    it("a final answer is saved with its expiry, replayed byte for byte with only the replayable headers", async () => {
      const key = newKey();
      const runner = define({
        one: {
          local: async (_ctx, tx) => {
            await tx.query("INSERT INTO effects (key) VALUES ($1)", [key]);
            return { response: jsonResponse(201, { id: 7 }, [["set-cookie", "s=1"]]) };
          },
        },
      });
      const first = await runner.run(claimOf(key), {});
      expect(first).toMatchObject({ kind: "executed", saved: true });
      // Created at the database's now: the expiry is that plus the retention, the same on every replay.
      expect(Math.abs(first.expiresAt.getTime() - (now.ms + RETENTION))).toBeLessThan(2_000);
      now.ms += 1_000;
      const again = await runner.run(claimOf(key), {});
      expect(again.kind).toBe("replayed");
      expect(again.expiresAt.getTime()).toBe(first.expiresAt.getTime());
      expect(again.response.status).toBe(201);
      expect(text(again.response)).toBe('{"id":7}');
      expect(again.response.headers).toEqual([["content-type", "application/json"]]);
      expect(await effects(key)).toBe(1);

      // replayHeaders chooses what is kept.
      const key2 = newKey();
      const only = define(
        { one: { local: async () => ({ response: ok() }) } },
        { replayHeaders: ["x-charge"] },
      );
      await only.run(claimOf(key2), {});
      expect((await only.run(claimOf(key2), {})).response.headers).toEqual([["x-charge", "ch_1"]]);
    });

    it("an answer that is not final is sent to this caller only: a local phase's writes roll back, the lease is freed", async () => {
      const key = newKey();
      let status = 503;
      const runner = define({
        one: {
          local: async (_ctx, tx) => {
            await tx.query("INSERT INTO effects (key) VALUES ($1)", [key]);
            return { response: jsonResponse(status, { status }) };
          },
        },
      });
      const first = await runner.run(claimOf(key), {});
      expect(first).toMatchObject({ kind: "executed", saved: false });
      expect(first.response.status).toBe(503);
      expect(await effects(key)).toBe(0);
      expect((await inspect(key))?.lease).toBeNull();
      status = 201;
      const second = await runner.run(claimOf(key), {});
      expect(second).toMatchObject({ kind: "executed", saved: true });
      expect(await effects(key)).toBe(1);
    });

    it("an external phase's answer that is not final frees the lease; saveStatuses makes a 409 final", async () => {
      const key = newKey();
      let calls = 0;
      const phases = {
        charge: {
          external: async () => {
            calls++;
            return { response: jsonResponse(409, { error: "limit reached" }) };
          },
        },
      };
      const plain = define(phases);
      expect(await plain.run(claimOf(key), {})).toMatchObject({ kind: "executed", saved: false });
      expect((await inspect(key))?.lease).toBeNull();
      expect(await plain.run(claimOf(key), {})).toMatchObject({ kind: "executed", saved: false });
      expect(calls).toBe(2);

      const key2 = newKey();
      const saving = define(phases, { saveStatuses: [409] });
      expect(await saving.run(claimOf(key2), {})).toMatchObject({ kind: "executed", saved: true });
      const replay = await saving.run(claimOf(key2), {});
      expect(replay.kind).toBe("replayed");
      expect(replay.response.status).toBe(409);
      expect(calls).toBe(3);
    });

    it("a shorter stored fingerprint is another request, not a prefix of this one", async () => {
      const key = newKey();
      const runner = define({ one: { local: async () => ({ response: ok() }) } });
      const full = claimOf(key);
      await runner.run({ ...full, fingerprint: full.fingerprint.slice(0, 16) }, {});
      expect(isKeyMismatchError(await rejection(runner.run(full, {})))).toBe(true);
    });
  });

  describe("moving through phases", () => {
    it("goes on to each phase's next (or the step's own), merging data; the context shows where it is", async () => {
      const key = newKey();
      const seen: unknown[] = [];
      const runner = define({
        start: {
          external: async (ctx) => {
            seen.push([ctx.phase, ctx.idempotencyKey, ctx.input, { ...ctx.data }]);
            return undefined; // nothing to record: on to `next`
          },
          next: "reserve",
        },
        reserve: {
          local: async (ctx, tx) => {
            seen.push([ctx.phase, { ...ctx.data }]);
            await tx.query("INSERT INTO effects (key, what) VALUES ($1, 'reserved')", [key]);
            return { data: { reservation: "r1" }, next: "charge" };
          },
          next: "skipped",
        },
        skipped: { local: async () => ({ response: jsonResponse(500, {}) }) },
        charge: {
          external: async (ctx) => {
            seen.push([ctx.phase, { ...ctx.data }]);
            return { data: { charge: "c1" } };
          },
          next: "finish",
        },
        finish: {
          local: async (ctx) => {
            seen.push([ctx.phase, { ...ctx.data }]);
            return { response: ok(ctx.data) };
          },
        },
      });
      const out = await runner.run(claimOf(key), { amount: 5 });
      expect(JSON.parse(text(out.response))).toEqual({ reservation: "r1", charge: "c1" });
      expect(seen).toEqual([
        ["start", `acct:${(await inspect(key))!.claimId}`, { amount: 5 }, {}],
        ["reserve", {}],
        ["charge", { reservation: "r1" }],
        ["finish", { reservation: "r1", charge: "c1" }],
      ]);
      expect((await inspect(key))?.phaseData).toEqual({ reservation: "r1", charge: "c1" });
    });

    it("keeps the phase data when the final answer brings none, and adds what it brings", async () => {
      const key = newKey();
      const runner = define({
        a: { external: async () => ({ data: { a: 1 } }), next: "b" },
        b: { external: async () => ({ response: ok() }) },
      });
      await runner.run(claimOf(key), {});
      expect((await inspect(key))?.phaseData).toEqual({ a: 1 });
      const key2 = newKey();
      const more = define({
        a: { external: async () => ({ data: { a: 1 } }), next: "b" },
        b: { local: async () => ({ response: ok(), data: { b: 2 } }) },
      });
      await more.run(claimOf(key2), {});
      expect((await inspect(key2))?.phaseData).toEqual({ a: 1, b: 2 });
    });

    it("a phase with nowhere to go, or going to a phase that does not exist, fails and frees the lease", async () => {
      const key = newKey();
      const nowhere = define({ a: { external: async () => ({ data: {} }) } });
      await expect(nowhere.run(claimOf(key), {})).rejects.toThrow(
        'phases "rules": phase "a" returned no response and has no next phase',
      );
      expect((await inspect(key))?.lease).toBeNull();
      const key2 = newKey();
      const lost = define({ a: { local: async () => ({ next: "zz" }) } });
      await expect(lost.run(claimOf(key2), {})).rejects.toThrow('phases "rules": "zz" is not a phase');
      expect((await inspect(key2))?.lease).toBeNull();
    });

    it("a key at a phase this runner does not have goes to a person (409 uncertain), never failing each retry", async () => {
      const key = newKey();
      // The crash happens at "before-phase" of "a": let it pass once, crash at "gone".
      let n = 0;
      const crashAtGone = define(
        {
          a: { external: async () => ({ data: {} }), next: "gone" },
          gone: { local: async () => ({ response: ok() }) },
        },
        { faults: { at: ({ point }) => point === "before-phase" && n++ === 1 } },
      );
      await expect(crashAtGone.run(claimOf(key), {})).rejects.toBeInstanceOf(SimulatedCrashError);
      now.ms += LEASE + 1;
      const renamed = define({ a: { local: async () => ({ response: ok() }) } });
      for (let i = 0; i < 2; i++) {
        await expect(renamed.run(claimOf(key), {})).rejects.toMatchObject({ code: "operation-uncertain" });
      }
      expect(await inspect(key)).toMatchObject({ state: "needs_review", lease: null });
      const [review] = (await openReviews(store)).filter((r) => r.key === key);
      expect(review?.reason).toBe('"gone" is not a phase of the key\'s runner');
    });

    it("a fresh lease comes with each recovery point", async () => {
      const key = newKey();
      const gate = deferred();
      const entered = deferred();
      const runner = define({
        a: { local: async () => ({ data: {} }), next: "b" },
        b: {
          external: async () => {
            entered.resolve();
            await gate.promise;
            return { response: ok() };
          },
        },
      });
      const t0 = now.ms;
      const running = runner.run(claimOf(key), {});
      await entered.promise;
      // The database's now at the claim, plus the lease.
      expect(Math.abs((await inspect(key))!.lease!.until.getTime() - (t0 + LEASE))).toBeLessThan(2_000);
      gate.resolve();
      await running;
    });

    it("custom crash points and the named ones crash there, freeing nothing", async () => {
      const key = newKey();
      const runner = define(
        {
          a: {
            local: async (ctx) => {
              await ctx.crash("inside-a");
              return { response: ok() };
            },
          },
        },
        { faults: crashOnceAt("inside-a") },
      );
      const err = await rejection(runner.run(claimOf(key), {}));
      expect(err).toBeInstanceOf(SimulatedCrashError);
      expect((err as SimulatedCrashError).info).toMatchObject({ point: "inside-a", phase: "a", key });
      expect((await inspect(key))?.lease).not.toBeNull();

      const key2 = newKey();
      const after = define(
        { a: { local: async () => ({ response: ok() }) } },
        { faults: crashOnceAt("after-commit") },
      );
      await expect(after.run(claimOf(key2), {})).rejects.toBeInstanceOf(SimulatedCrashError);
      expect((await inspect(key2))?.state).toBe("done");
    });
  });

  describe("failures", () => {
    it("a database that is busy (serialization failure, deadlock) is retryable; other errors come back as they are", async () => {
      for (const code of ["40001", "40P01"]) {
        const key = newKey();
        const cause = Object.assign(new Error(`busy ${code}`), { code });
        const runner = define({
          a: {
            local: async () => {
              throw cause;
            },
          },
        });
        const err = await rejection(runner.run(claimOf(key), {}));
        expect(isRetryableError(err), code).toBe(true);
        expect((err as Error).message).toBe("The database was busy; retry with the same key.");
        expect((err as Error).cause).toBe(cause);
        expect((await inspect(key))?.lease).toBeNull();
      }
      const plain = new Error("no such account");
      const key = newKey();
      const runner = define({
        a: {
          local: async () => {
            throw plain;
          },
        },
      });
      expect(await rejection(runner.run(claimOf(key), {}))).toBe(plain);
    });

    it("when freeing the lease fails too, both errors are reported; an unreachable database is reported as such", async () => {
      const failing = new Proxy(db, {
        get(target, prop, receiver) {
          if (prop === "query") {
            return (sql: string, params?: unknown[]) => {
              if (/SET lease_token = NULL, lease_until = NULL, updated_at/.test(sql) && breakRelease) {
                return Promise.reject(breakRelease);
              }
              return target.query(sql, params);
            };
          }
          return Reflect.get(target, prop, receiver);
        },
      });
      let breakRelease: Error | undefined;
      const s2 = await PostgresStore.open(failing, { timeShift: now, retentionMs: RETENTION });
      const phaseError = new Error("provider said no");
      const runner = definePhases<D, D>({
        store: s2,
        name: "rules",
        heartbeatMs: 0,
        answerWithinMs: Number.POSITIVE_INFINITY,
        phases: {
          a: {
            external: async () => {
              throw phaseError;
            },
          },
        },
      });
      breakRelease = new Error("disk full");
      const both = await rejection(runner.run(claimOf(newKey()), {}));
      expect(both).toBeInstanceOf(AggregateError);
      expect((both as AggregateError).errors).toEqual([phaseError, breakRelease]);
      expect((both as Error).message).toBe("the phase failed and freeing its lease failed too");

      breakRelease = Object.assign(new Error("connection terminated"), { code: "57P01" });
      expect(await rejection(runner.run(claimOf(newKey()), {}))).toBe(breakRelease);
    });
  });

  describe("leases", () => {
    it("a duplicate while the lease is live is told to wait: 2 s at most, 1 s when less than that is left", async () => {
      const key = newKey();
      const gate = deferred();
      const entered = deferred();
      const runner = define({
        a: {
          external: async () => {
            entered.resolve();
            await gate.promise;
            return { response: ok() };
          },
        },
      });
      const running = runner.run(claimOf(key), {});
      await entered.promise;
      const e1 = await rejection(runner.run(claimOf(key), {}));
      expect(e1).toBeInstanceOf(KeyInFlightError);
      expect((e1 as KeyInFlightError).retryAfterSeconds).toBe(2);
      now.ms += LEASE - 500;
      const e2 = await rejection(runner.run(claimOf(key), {}));
      expect((e2 as KeyInFlightError).retryAfterSeconds).toBe(1);
      gate.resolve();
      await running;
    });

    it("a takeover after a crash is reported; retrying after a freed lease is not a takeover", async () => {
      const key = newKey();
      const takeovers: unknown[] = [];
      let fail = true;
      const phases = {
        a: {
          external: async () => {
            if (fail) throw new RetryableError("provider timeout");
            return { response: ok() };
          },
        },
      };
      const runner = define(phases, { onLeaseTakeover: (e) => takeovers.push(e) });
      await expect(runner.run(claimOf(key), {})).rejects.toThrow("provider timeout");
      fail = false;
      await runner.run(claimOf(key), {});
      expect(takeovers).toEqual([]);

      const key2 = newKey();
      const crashing = define(phases, { faults: crashOnceAt("before-phase") });
      await expect(crashing.run(claimOf(key2), {})).rejects.toBeInstanceOf(SimulatedCrashError);
      now.ms += LEASE;
      await runner.run(claimOf(key2), {});
      expect(takeovers).toEqual([{ scope: "acct", key: key2, point: "a" }]);
    });

    it("concurrent retries of an abandoned key: one takes it over, the others wait or get its answer", async () => {
      if (backend.name === "pglite") return; // one connection: no race
      const key = newKey();
      let calls = 0;
      const phases = {
        a: {
          external: async () => {
            calls++;
            await new Promise((r) => setTimeout(r, 30));
            return { response: ok() };
          },
        },
      };
      await expect(
        define(phases, { faults: crashOnceAt("after-claim") }).run(claimOf(key), {}),
      ).rejects.toBeInstanceOf(SimulatedCrashError);
      now.ms += LEASE;
      // Every retry reads the abandoned row before any of them takes it over.
      const racing = barrierDb(3, (sql) => sql.trimStart().startsWith("WITH found AS"));
      const s2 = await PostgresStore.open(racing.db, { timeShift: now, retentionMs: RETENTION });
      const runners = racers(s2, phases);
      const outcomes = await Promise.allSettled(runners.map((runner) => runner.run(claimOf(key), {})));
      expect(racing.arrived()).toBe(3);
      const done = outcomes.filter((o) => o.status === "fulfilled");
      const refused = outcomes.filter((o) => o.status === "rejected");
      expect(calls).toBe(1);
      expect(done.length).toBeGreaterThanOrEqual(1);
      for (const r of refused) expect(isKeyInFlightError((r as PromiseRejectedResult).reason)).toBe(true);
    });

    it("first claims racing in the first minutes of a partition: one claims (with its marker), the others wait", async () => {
      if (backend.name === "pglite") return; // one connection: no race
      const key = newKey();
      const at = store.partitions.startOf(store.partitions.bucketOf(now.ms) + 1) + 1;
      // Every racer reads "no such key" before any of them claims.
      let arrived = 0;
      const [barrier, open] = latch();
      setTimeout(() => open(), 2_000).unref();
      const racing = new Proxy(db, {
        get(target, prop, receiver) {
          if (prop === "query") {
            return async (sql: string, params?: unknown[]) => {
              const res = await target.query(sql, params);
              if (sql.trimStart().startsWith("SELECT bucket, fingerprint") && arrived < 3) {
                if (++arrived === 3) open();
                await barrier;
              }
              return res;
            };
          }
          return Reflect.get(target, prop, receiver);
        },
      });
      const s2 = await PostgresStore.open(racing, { timeShift: new TestTime(at), retentionMs: RETENTION });
      const hold = deferred();
      let calls = 0;
      const runners = racers(s2, {
        a: {
          external: async () => {
            calls++;
            await hold.promise;
            return { response: ok() };
          },
        },
      });
      const outs = runners.map((runner) => runner.run(claimOf(key), {}).catch((e: unknown) => e));
      await barrier;
      await new Promise((r) => setTimeout(r, 200));
      hold.resolve();
      const results = await Promise.all(outs);
      expect(calls).toBe(1);
      expect(results.filter((r) => (r as { kind?: string })?.kind === "executed")).toHaveLength(1);
      for (const r of results) {
        const kind = (r as { kind?: string })?.kind;
        expect(kind === "executed" || kind === "replayed" || isKeyInFlightError(r), String(r)).toBe(true);
      }
    });

    it("a worker whose lease was taken over cannot record its call's result, nor its next point", async () => {
      for (const step of [{ response: ok() }, { data: { x: 1 } }]) {
        const key = newKey();
        const gate = deferred();
        const entered = deferred();
        let slow = true;
        const runner = define({
          a: {
            external: async () => {
              if (slow) {
                slow = false;
                entered.resolve();
                await gate.promise;
              }
              return step;
            },
            next: "b",
          },
          b: { local: async () => ({ response: jsonResponse(201, { by: "b" }) }) },
        });
        const late = runner.run(claimOf(key), {});
        await entered.promise;
        now.ms += LEASE + 1;
        const winner = await runner.run(claimOf(key), {});
        expect(winner.response.status).toBe(201);
        gate.resolve();
        expect(isLeaseLostError(await rejection(late))).toBe(true);
        expect((await inspect(key))?.state).toBe("done");
      }
    });

    it("a duplicate is fenced off while a local phase holds the key row; a row lock past lockTimeoutMs is retryable", async () => {
      if (backend.name === "pglite") return; // one connection: nothing can hold a lock against it
      const key = newKey();
      await db.exec(`INSERT INTO effects (key, what) VALUES ('${key}', 'locked')`);
      const locked = deferred();
      const unlock = deferred();
      const holder = db.transaction(async (tx) => {
        await tx.query("SELECT 1 FROM effects WHERE key = $1 FOR UPDATE", [key]);
        locked.resolve();
        await unlock.promise;
      });
      await locked.promise;
      const runner = define({
        a: {
          local: async (_ctx, tx) => {
            await tx.query("SELECT 1 FROM effects WHERE key = $1 FOR UPDATE", [key]);
            return { response: ok() };
          },
        },
      });
      try {
        const err = await rejection(runner.run(claimOf(key), {}));
        expect(isRetryableError(err)).toBe(true);
        expect((await inspect(key))?.lease).toBeNull();
      } finally {
        unlock.resolve();
        await holder;
      }
      expect((await runner.run(claimOf(key), {})).kind).toBe("executed");
    });

    it("a key stored without its input resumes with this call's input", async () => {
      const key = newKey();
      const inputs: unknown[] = [];
      const phases = {
        a: {
          external: async (ctx: { input: D }) => {
            inputs.push(ctx.input);
            return { response: ok() };
          },
        },
      };
      await expect(
        define(phases, { faults: crashOnceAt("before-phase") }).run(claimOf(key), { v: 1 }),
      ).rejects.toBeInstanceOf(SimulatedCrashError);
      await db.query("UPDATE idem.keys SET request = NULL WHERE scope = 'acct' AND key = $1", [key]);
      now.ms += LEASE;
      await define(phases).run(claimOf(key), { v: 2 });
      expect(inputs).toEqual([{ v: 2 }]);
    });
  });

  describe("an external system without idempotency keys", () => {
    it("records the attempt before calling; a worker whose lease went before that calls nothing", async () => {
      const key = newKey();
      let calls = 0;
      const stall = deferred();
      const stalled = deferred();
      let first = true;
      const runner = define(
        {
          a: {
            idempotent: false,
            lookup: async () => undefined,
            external: async () => {
              calls++;
              return { response: ok() };
            },
          },
        },
        {
          faults: {
            at: async ({ point }) => {
              if (point === "before-phase" && first) {
                first = false;
                stalled.resolve();
                await stall.promise;
              }
              return false;
            },
          },
        },
      );
      const late = runner.run(claimOf(key), {});
      await stalled.promise;
      now.ms += LEASE + 1;
      await runner.run(claimOf(key), {});
      stall.resolve();
      expect(isLeaseLostError(await rejection(late))).toBe(true);
      expect(calls).toBe(1);
    });

    it("a takeover looks up the effect only when a call may have begun, in each phase", async () => {
      const key = newKey();
      const looked: string[] = [];
      const called: string[] = [];
      const careful = (name: string, next?: string) => ({
        idempotent: false,
        lookup: async () => {
          looked.push(name);
          return undefined;
        },
        external: async () => {
          called.push(name);
          return next ? { data: { [name]: true } } : { response: ok() };
        },
        ...(next ? { next } : {}),
      });
      // Crashed before the first call was recorded: no lookup, one call.
      await expect(
        define({ a: careful("a", "b"), b: careful("b") }, { faults: crashOnceAt("before-phase") }).run(
          claimOf(key),
          {},
        ),
      ).rejects.toBeInstanceOf(SimulatedCrashError);
      now.ms += LEASE;
      await define({ a: careful("a", "b"), b: careful("b") }).run(claimOf(key), {});
      expect(called).toEqual(["a", "b"]);
      expect(looked).toEqual([]);
    });

    it("a failed call whose effect cannot be looked up goes to review with its reason", async () => {
      const reviews: { scope: string; key: string; point: string; reason: string }[] = [];
      const key = newKey();
      const runner = define(
        {
          pay: {
            idempotent: false,
            external: async () => {
              throw "socket hang up";
            },
          },
        },
        { onNeedsReview: (e) => reviews.push(e) },
      );
      expect(isOperationUncertainError(await rejection(runner.run(claimOf(key), {})))).toBe(true);
      expect(reviews).toEqual([
        {
          scope: "acct",
          key,
          point: "pay",
          reason: "the call failed (socket hang up); the phase has no lookup",
        },
      ]);
      expect((await inspect(key))?.state).toBe("needs_review");

      // A takeover of a key whose call may have begun, without a lookup.
      const key2 = newKey();
      const crashing = define(
        { pay: { idempotent: false, external: async () => ({ response: ok() }) } },
        { faults: crashOnceAt("after-external"), onNeedsReview: (e) => reviews.push(e) },
      );
      await expect(crashing.run(claimOf(key2), {})).rejects.toBeInstanceOf(SimulatedCrashError);
      now.ms += LEASE;
      expect(isOperationUncertainError(await rejection(crashing.run(claimOf(key2), {})))).toBe(true);
      expect(reviews[1]!.reason).toBe("a call may have reached the provider; the phase has no lookup");
    });

    it("a lookup that cannot tell is retryable with its reason, until maxLookupFailures sends the key to review", async () => {
      const key = newKey();
      const reviews: string[] = [];
      const down = new Error("search is down");
      const runner = define(
        {
          pay: {
            idempotent: false,
            lookup: async () => {
              throw down;
            },
            external: async () => {
              throw new Error("timeout");
            },
          },
        },
        { maxLookupFailures: 2, onNeedsReview: (e) => reviews.push(e.reason) },
      );
      const e1 = await rejection(runner.run(claimOf(key), {}));
      expect(isRetryableError(e1)).toBe(true);
      expect((e1 as Error).message).toBe(
        "Could not find out whether the call took effect (search is down); retry later.",
      );
      expect((e1 as Error).cause).toBe(down);
      const e2 = await rejection(runner.run(claimOf(key), {}));
      expect(isOperationUncertainError(e2)).toBe(true);
      expect(reviews).toEqual([
        "a call may have reached the provider; 2 lookups could not tell (search is down)",
      ]);
    });

    it("a lookup that ends after the lease was taken over records nothing", async () => {
      const key = newKey();
      const gate = deferred();
      const looking = deferred();
      let slowLookup = true;
      const runner = define({
        pay: {
          idempotent: false,
          lookup: async () => {
            if (slowLookup) {
              slowLookup = false;
              looking.resolve();
              await gate.promise;
              throw new Error("search timed out");
            }
            return undefined;
          },
          external: async () => {
            if (slowLookup) throw new Error("timeout");
            return { response: ok() };
          },
        },
      });
      const late = runner.run(claimOf(key), {});
      await looking.promise;
      now.ms += LEASE + 1;
      await runner.run(claimOf(key), {});
      gate.resolve();
      expect(isLeaseLostError(await rejection(late))).toBe(true);
    });
  });

  describe("the answer bound", () => {
    it("answers 409 (Retry-After 2) at the bound; a background failure is reported with its key", async () => {
      const key = newKey();
      const background: unknown[] = [];
      const gate = deferred();
      const boom = new Error("late failure");
      const runner = define(
        {
          a: {
            external: async () => {
              await gate.promise;
              throw boom;
            },
          },
        },
        { answerWithinMs: 50, onBackgroundError: (err, e) => background.push([err, e]) },
      );
      const err = await rejection(runner.run(claimOf(key), {}));
      expect(err).toBeInstanceOf(KeyInFlightError);
      expect((err as KeyInFlightError).retryAfterSeconds).toBe(2);
      gate.resolve();
      await new Promise((r) => setTimeout(r, 100));
      expect(background).toEqual([[boom, { scope: "acct", key }]]);
    });

    it("the bound counts from the start of the call, the claim included", async () => {
      const key = newKey();
      let claims = 0;
      let claimed = 0; // when the (slow) claim statement answered
      const slowClaims = new Proxy(db, {
        get(target, prop, receiver) {
          if (prop === "query") {
            return async (sql: string, params?: unknown[]) => {
              if (!sql.includes("INSERT INTO")) return target.query(sql, params);
              claims++;
              await new Promise((r) => setTimeout(r, 300));
              const r = await target.query(sql, params);
              claimed = performance.now();
              return r;
            };
          }
          return Reflect.get(target, prop, receiver);
        },
      });
      const s2 = await PostgresStore.open(slowClaims, { timeShift: now, retentionMs: RETENTION });
      const gate = deferred();
      const runner = definePhases<D, D>({
        store: s2,
        name: "rules",
        heartbeatMs: 0,
        phases: {
          a: {
            external: async () => {
              await gate.promise;
              return { response: ok() };
            },
          },
        },
      });
      const t0 = performance.now();
      const err = await rejection(runner.run(claimOf(key), {}, { answerWithinMs: 450 }));
      const answered = performance.now();
      gate.resolve();
      expect(err).toBeInstanceOf(KeyInFlightError);
      expect(claims).toBe(1); // one statement looked the key up and claimed it
      // What was left of the bound once the claim answered (about 150 ms, none if the claim took longer
      // on a busy machine), not the whole bound again (450 ms).
      expect(answered - claimed).toBeLessThan(Math.max(0, 450 - (claimed - t0)) + 250);
    });
  });

  describe("more rules", () => {
    const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
    /** `db` with `query` (and every transaction's `query`) replaced by `fn(sql, params, real)`. */
    const wrapDb = (
      base: Db,
      fn: (
        sql: string,
        params: unknown[] | undefined,
        real: (s: string, p?: unknown[]) => Promise<unknown>,
      ) => Promise<unknown>,
    ): Db => {
      const wrapTx = <T extends object>(tx: T): T =>
        new Proxy(tx, {
          get(target, prop) {
            const v = Reflect.get(target, prop);
            if (prop === "query") {
              const real = (v as (s: string, p?: unknown[]) => Promise<unknown>).bind(target);
              return (sql: string, params?: unknown[]) => fn(sql, params, real);
            }
            return typeof v === "function" ? v.bind(target) : v;
          },
        });
      return new Proxy(base, {
        get(target, prop) {
          if (prop === "query") {
            return (sql: string, params?: unknown[]) => fn(sql, params, (s, p) => target.query(s, p));
          }
          if (prop === "transaction") {
            return (body: (tx: object) => Promise<unknown>, options?: object) =>
              target.transaction((tx) => body(wrapTx(tx)), options as never);
          }
          const v = Reflect.get(target, prop);
          return typeof v === "function" ? v.bind(target) : v;
        },
      }) as Db;
    };

    it("a local phase that returns nothing goes on to its next phase, keeping the data", async () => {
      const key = newKey();
      const runner = define({
        a: { external: async () => ({ data: { a: 1 } }), next: "b" },
        b: {
          local: async (_ctx, tx) => {
            await tx.query("INSERT INTO effects (key, what) VALUES ($1, 'b')", [key]);
            return undefined;
          },
          next: "c",
        },
        c: { local: async (ctx) => ({ response: ok(ctx.data) }) },
      });
      const out = await runner.run(claimOf(key), {});
      expect(JSON.parse(text(out.response))).toEqual({ a: 1 });
      expect(await effects(key)).toBe(1);
    });

    it("a crash before a local phase commits its next point leaves nothing of it; the retry runs it again", async () => {
      const key = newKey();
      let runs = 0;
      const phases = {
        a: {
          local: async (_ctx: unknown, tx: { query(sql: string, params?: unknown[]): Promise<unknown> }) => {
            runs++;
            await tx.query("INSERT INTO effects (key, what) VALUES ($1, 'a')", [key]);
            return { data: { a: 1 } };
          },
          next: "b",
        },
        b: { local: async () => ({ response: ok() }) },
      } as Record<string, Phase<D, D>>;
      await expect(
        define(phases, { faults: crashOnceAt("before-commit") }).run(claimOf(key), {}),
      ).rejects.toBeInstanceOf(SimulatedCrashError);
      expect(await effects(key)).toBe(0);
      expect((await inspect(key))?.recoveryPoint).toBe("a");
      now.ms += LEASE;
      expect((await define(phases).run(claimOf(key), {})).kind).toBe("executed");
      expect(runs).toBe(2);
      expect(await effects(key)).toBe(1);
    });

    it("a worker whose lease was taken over does not go on to the next external phase", async () => {
      const key = newKey();
      const gate = deferred();
      const entered = deferred();
      let slow = true;
      let charges = 0;
      const runner = define({
        a: {
          external: async () => {
            if (slow) {
              slow = false;
              entered.resolve();
              await gate.promise;
            }
            return { data: { a: 1 } };
          },
          next: "charge",
        },
        charge: {
          external: async () => {
            charges++;
            return { response: ok() };
          },
        },
      });
      const late = runner.run(claimOf(key), {});
      await entered.promise;
      now.ms += LEASE + 1;
      expect((await runner.run(claimOf(key), {})).kind).toBe("executed");
      gate.resolve();
      expect(isLeaseLostError(await rejection(late))).toBe(true);
      expect(charges).toBe(1);
    });

    it("renews the lease while an external call runs, one renewal at a time, and stops when the call ends", async () => {
      const key = newKey();
      let renewals = 0;
      let inFlight = 0;
      let mostInFlight = 0;
      const slowRenewals = wrapDb(db, async (sql, params, real) => {
        if (!sql.includes("SET lease_until =")) return real(sql, params);
        renewals++;
        mostInFlight = Math.max(mostInFlight, ++inFlight);
        try {
          await sleep(60);
          return await real(sql, params);
        } finally {
          inFlight--;
        }
      });
      const s2 = await PostgresStore.open(slowRenewals, { timeShift: now, retentionMs: RETENTION });
      const runner = definePhases<D, D>({
        store: s2,
        name: "rules",
        heartbeatMs: 10,
        answerWithinMs: Number.POSITIVE_INFINITY,
        phases: {
          a: {
            external: async () => {
              await sleep(300);
              return { data: { a: 1 } };
            },
            next: "b",
          },
          b: {
            external: async () => {
              await sleep(300);
              return { response: ok() };
            },
          },
        },
      });
      expect((await runner.run(claimOf(key), {})).kind).toBe("executed");
      expect(renewals).toBeGreaterThanOrEqual(4);
      // One at a time per heartbeat: the first phase's heartbeat ended with its call, but its last
      // renewal may still be out (on a busy machine, for several of the second phase's) while the second
      // phase's heartbeat renews. A heartbeat that did not wait for its renewal would have had about six
      // out at once (a 10 ms beat, 60 ms renewals).
      expect(mostInFlight).toBeLessThanOrEqual(2);
      const after = renewals;
      await sleep(100);
      expect(renewals).toBe(after);
    });

    it("a worker whose heartbeat finds its lease taken over answers nothing, not even an answer that is not final", async () => {
      const key = newKey();
      const gate = deferred();
      const entered = deferred();
      const takenOver = deferred();
      let first = true;
      // The late worker's renewals wait until the takeover is done: one landing between the time shift
      // and the takeover (a busy machine delays the takeover past a 10 ms beat) would make its lease
      // live again, and the second run would rightly be refused 409.
      const heldRenewals = wrapDb(db, async (sql, params, real) => {
        if (sql.includes("SET lease_until =")) await takenOver.promise;
        return real(sql, params);
      });
      const s2 = await PostgresStore.open(heldRenewals, { timeShift: now, retentionMs: RETENTION });
      const runner = define(
        {
          a: {
            external: async () => {
              if (first) {
                first = false;
                entered.resolve();
                await gate.promise;
                return { response: jsonResponse(503, { busy: true }) };
              }
              return { response: ok() };
            },
          },
        },
        { heartbeatMs: 10, store: s2 },
      );
      const late = runner.run(claimOf(key), {});
      await entered.promise;
      now.ms += LEASE + 1;
      expect((await runner.run(claimOf(key), {})).kind).toBe("executed");
      takenOver.resolve();
      await sleep(100); // the late worker's heartbeat sees the other token
      gate.resolve();
      expect(isLeaseLostError(await rejection(late))).toBe(true);
    });

    it("a call or a lookup that rejects with no error object is handled like any other failure", async () => {
      const key = newKey();
      const reviews: string[] = [];
      const runner = define(
        { pay: { idempotent: false, external: () => Promise.reject(undefined) } },
        { onNeedsReview: (e) => reviews.push(e.reason) },
      );
      expect(isOperationUncertainError(await rejection(runner.run(claimOf(key), {})))).toBe(true);
      expect(reviews).toEqual(["the call failed (undefined); the phase has no lookup"]);

      const key2 = newKey();
      const blind = define({
        pay: {
          idempotent: false,
          lookup: () => Promise.reject(null),
          external: async () => {
            throw new Error("timeout");
          },
        },
      });
      const err = await rejection(blind.run(claimOf(key2), {}));
      expect(isRetryableError(err)).toBe(true);
      expect((err as Error).message).toBe(
        "Could not find out whether the call took effect (null); retry later.",
      );
    });

    it("a failure within the answer bound goes to the caller only; without onBackgroundError a late one is dropped quietly", async () => {
      const background: unknown[] = [];
      const boom = new Error("quick failure");
      const quick = define(
        {
          a: {
            external: async () => {
              throw boom;
            },
          },
        },
        // Far longer than the failure takes (a claim and a release), so a busy machine answers it too.
        { answerWithinMs: 2_000, onBackgroundError: (err) => background.push(err) },
      );
      expect(await rejection(quick.run(claimOf(newKey()), {}))).toBe(boom);
      await sleep(100);
      expect(background).toEqual([]);

      const unhandled: unknown[] = [];
      const onUnhandled = (e: unknown) => unhandled.push(e);
      process.on("unhandledRejection", onUnhandled);
      try {
        const gate = deferred();
        const quiet = define(
          {
            a: {
              external: async () => {
                await gate.promise;
                throw new Error("late failure");
              },
            },
          },
          { answerWithinMs: 50 },
        );
        expect(await rejection(quiet.run(claimOf(newKey()), {}))).toBeInstanceOf(KeyInFlightError);
        gate.resolve();
        await sleep(100);
        expect(unhandled).toEqual([]);
      } finally {
        process.off("unhandledRejection", onUnhandled);
      }
    });

    it("a local phase waits for a row lock held a moment (within lockTimeoutMs)", async () => {
      if (backend.name === "pglite") return; // one connection: nothing can hold a lock against it
      const key = newKey();
      await db.query("INSERT INTO effects (key, what) VALUES ($1, 'locked')", [key]);
      const locked = deferred();
      const holder = db.transaction(async (tx) => {
        await tx.query("SELECT 1 FROM effects WHERE key = $1 FOR UPDATE", [key]);
        locked.resolve();
        await sleep(60);
      });
      await locked.promise;
      const runner = define({
        a: {
          local: async (_ctx, tx) => {
            await tx.query("SELECT 1 FROM effects WHERE key = $1 FOR UPDATE", [key]);
            return { response: ok() };
          },
        },
      });
      const out = await runner.run(claimOf(key), {});
      await holder;
      expect(out).toMatchObject({ kind: "executed", saved: true });
    });

    it("a client already gone: a new key is not claimed, a finished key still gets its answer", async () => {
      const gone = AbortSignal.abort();
      const key = newKey();
      let calls = 0;
      const runner = define({
        a: {
          local: async () => {
            calls++;
            return { response: ok() };
          },
        },
      });
      const err = await rejection(runner.run(claimOf(key), {}, { signal: gone }));
      expect(isRetryableError(err)).toBe(true);
      expect((err as Error).message).toBe(
        "The client went away before the key was claimed; nothing was done.",
      );
      expect(await inspect(key)).toBeUndefined();
      await runner.run(claimOf(key), {});
      const again = await runner.run(claimOf(key), {}, { signal: gone });
      expect(again.kind).toBe("replayed");
      expect(calls).toBe(1);
    });

    it("duplicates in one process wait for the first claim, then read the key: one claim statement", async () => {
      const key = newKey();
      let calls = 0;
      let claims = 0;
      const counted = wrapDb(db, (sql, params, real) => {
        if (sql.trimStart().startsWith("WITH found AS")) claims++;
        return real(sql, params);
      });
      const s2 = await PostgresStore.open(counted, { timeShift: now, retentionMs: RETENTION });
      const runner = defineOn(s2, {
        a: {
          external: async () => {
            calls++;
            await sleep(50);
            return { response: ok({ n: calls }) };
          },
        },
      });
      const outcomes = await Promise.allSettled(
        Array.from({ length: 10 }, () => runner.run(claimOf(key), {})),
      );
      expect(calls).toBe(1);
      expect(claims).toBe(1);
      // The others met the live lease (409 in flight) or, once it finished, its saved answer.
      const kinds = outcomes.map((o) =>
        o.status === "fulfilled"
          ? o.value.kind
          : isKeyInFlightError(o.reason)
            ? "in flight"
            : String(o.reason),
      );
      expect(kinds.filter((k) => k === "executed")).toHaveLength(1);
      expect(kinds.every((k) => k === "executed" || k === "replayed" || k === "in flight")).toBe(true);
      expect((await runner.run(claimOf(key), {})).kind).toBe("replayed");
    });

    it("retries that lose the takeover of an abandoned key to a worker that then finishes get its answer", async () => {
      if (backend.name === "pglite") return; // one connection: no race
      const key = newKey();
      let calls = 0;
      const phases = {
        a: {
          external: async () => {
            calls++;
            return { response: ok({ n: calls }) };
          },
        },
      };
      await expect(
        define(phases, { faults: crashOnceAt("after-claim") }).run(claimOf(key), {}),
      ).rejects.toBeInstanceOf(SimulatedCrashError);
      now.ms += LEASE;
      // Every retry reads the abandoned row; the first takes it over, the others' takeovers wait for
      // its answer to be saved.
      const racing = barrierDb(3, (sql) => sql.trimStart().startsWith("WITH found AS"));
      const finished = deferred();
      let takeovers = 0;
      const ordered = wrapDb(racing.db, async (sql, params, real) => {
        if (sql.includes("RETURNING recovery_point, phase_data")) {
          if (takeovers++ > 0) await finished.promise;
          return real(sql, params);
        }
        const res = await real(sql, params);
        if (sql.includes("SET recovery_point = 'done'")) finished.resolve();
        return res;
      });
      const s2 = await PostgresStore.open(ordered, { timeShift: now, retentionMs: RETENTION });
      const runners = racers(s2, phases);
      const outcomes = await Promise.all(runners.map((runner) => runner.run(claimOf(key), {})));
      expect(calls).toBe(1);
      expect(outcomes.map((o) => o.kind).sort()).toEqual(["executed", "replayed", "replayed"]);
      for (const o of outcomes) expect(text(o.response)).toBe('{"n":1}');
    });

    it("a database error during a first claim at a partition boundary is thrown, not taken for a race", async () => {
      const key = newKey();
      const at = store.partitions.startOf(store.partitions.bucketOf(now.ms) + 1) + 1;
      const broken = new Error("disk full");
      const failing = wrapDb(db, (sql, params, real) =>
        sql.trimStart().startsWith("WITH place AS") ? Promise.reject(broken) : real(sql, params),
      );
      const s2 = await PostgresStore.open(failing, { timeShift: new TestTime(at), retentionMs: RETENTION });
      const runner = definePhases<D, D>({
        store: s2,
        name: "rules",
        heartbeatMs: 0,
        answerWithinMs: Number.POSITIVE_INFINITY,
        phases: { a: { local: async () => ({ response: ok() }) } },
      });
      expect(await rejection(runner.run(claimOf(key), {}))).toBe(broken);
      expect(await s2.inspect("acct", key)).toBeUndefined();
    });
  });
});
