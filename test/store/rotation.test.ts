/**
 * Key rotation while instances roll: instances of one service on one database, under continuous load,
 * each replaying the others' keys, while instances are replaced one by one with a new key list and the
 * new key is promoted. A store seals with the key the database records as promoted, and a promotion is
 * refused while a running instance cannot open the key: so no rollout order (new key first or second
 * in the list) makes an instance seal what another cannot open. 0 failures, every replay byte for byte.
 */
import { randomBytes, randomUUID } from "node:crypto";
import { Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AesGcmSealer, type SealingKey } from "../../src/core/index.ts";
import { idempotency } from "../../src/http/hono.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { SealingKeyPromotionError } from "../../src/postgres/secrets/sealing-keys.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { backends, type OpenDb } from "../helpers/db.ts";

const k1: SealingKey = { id: "k1", key: randomBytes(32) };
const k2: SealingKey = { id: "k2", key: randomBytes(32) };

interface Instance {
  store: PostgresStore;
  send(key: string): Promise<Response>;
}

describe.each(backends)("rolling key rotation on $name", (backend) => {
  let open: OpenDb;
  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
  });
  afterAll(async () => {
    await open?.close();
  });

  async function instance(keys: SealingKey[]): Promise<Instance> {
    const store = await PostgresStore.open(open.db, { sealer: new AesGcmSealer(keys) });
    const app = new Hono();
    app.post("/v1/things", idempotency({ store, scope: () => "acct" }), (c) =>
      c.json({ id: randomUUID() }, 201, { location: `/v1/things/${randomUUID()}` }),
    );
    const send = async (key: string): Promise<Response> =>
      app.request("/v1/things", { method: "POST", headers: { "idempotency-key": key }, body: "{}" });
    return { store, send };
  }

  /** Which key each saved body in the table is sealed with (the id in its header), counted. */
  async function sealedWith(): Promise<Record<string, number>> {
    const { rows } = await open.db.query<{ id: string; n: number }>(
      `SELECT convert_from(substring(body FROM 7 FOR get_byte(body, 5)), 'UTF8') AS id, count(*)::int AS n
       FROM idem.keys WHERE body IS NOT NULL GROUP BY 1`,
    );
    return Object.fromEntries(rows.map((r) => [r.id, r.n]));
  }

  /**
   * Load until `stop`: each round sends a new key to one live instance, then replays it on two (the
   * pool read at each send, so instances replaced meanwhile take part). Every answer is recorded; a
   * replay must repeat the first answer's status, location and body byte for byte.
   */
  function load(live: Instance[], stop: { now: boolean }) {
    const statuses: number[] = [];
    const mismatches: string[] = [];
    const pick = (i: number) => live[i % live.length]!;
    const worker = async (w: number) => {
      for (let i = w; !stop.now; i += 3) {
        await new Promise((r) => setImmediate(r)); // PGlite answers in microtasks: let timers run
        const key = randomUUID();
        const first = await pick(i).send(key);
        const body = await first.text();
        statuses.push(first.status);
        for (const j of [i + 1, i + 2]) {
          const again = await pick(j).send(key);
          const text = await again.text();
          statuses.push(again.status);
          if (again.status === 201 && first.status === 201) {
            if (text !== body || again.headers.get("location") !== first.headers.get("location")) {
              mismatches.push(key);
            }
            if (again.headers.get("idempotent-replayed") !== "true") mismatches.push(`${key}: not replayed`);
          }
        }
      }
    };
    const done = Promise.all([0, 1, 2, 3].map(worker));
    return { statuses, mismatches, done };
  }

  const until = async (what: () => Promise<boolean>) => {
    for (let i = 0; i < 400 && !(await what()); i++) await new Promise((r) => setTimeout(r, 50));
    expect(await what()).toBe(true);
  };

  it("replacing instances one by one, then promoting k2: 0 failures, replays byte for byte", async () => {
    const a = await instance([k1]);
    const b = await instance([k1]);
    const live = [a, b];
    const stop = { now: false };
    const run = load(live, stop);
    const progress = async (n: number) => {
      const at = run.statuses.length;
      await until(async () => run.statuses.length >= at + n);
    };
    await progress(30);

    // Rollout: b is replaced by an instance that lists k2 FIRST (the one-step mistake). It opens k2
    // but still seals with k1, the promoted key, which a still opens.
    const b2 = await instance([k2, k1]);
    live[1] = b2;
    await b.store.retire();
    await progress(30);
    expect(await sealedWith()).not.toHaveProperty("k2");

    // Promoting k2 while a (which cannot open it) runs is refused, naming a.
    const refused = await b2.store.promoteSealingKey("k2").catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(SealingKeyPromotionError);
    expect(String((refused as Error).message)).toContain("opens k1;");

    // a is replaced too; now every running instance opens k2, and the promotion goes through.
    const a2 = await instance([k1, k2]);
    live[0] = a2;
    await a.store.retire();
    await progress(30);
    expect(await b2.store.promoteSealingKey("k2")).toEqual({ previous: "k1" });
    await until(async () => ((await sealedWith()).k2 ?? 0) >= 10);
    // a2 lists k1 first, yet seals with k2 once it reads the promotion (its next refresh, within 5 s).
    await until(async () => (a2.store.sealer as { sealingId?: string }).sealingId === "k2");
    await progress(30);

    stop.now = true;
    await run.done;
    expect(run.statuses.length).toBeGreaterThan(150);
    expect(new Set(run.statuses)).toEqual(new Set([201]));
    expect(run.mismatches).toEqual([]);
  });

  it("an instance started later without the promoted key: its replays are 503, never 500, and it seals what others open", async () => {
    const current = await instance([k2, k1]); // k2 is promoted by the test above
    const late = await instance([k1]); // misconfigured: lacks k2
    const key = randomUUID();
    expect((await current.send(key)).status).toBe(201);
    const replay = await late.send(key);
    expect(replay.status).toBe(503);
    expect(replay.headers.get("retry-after")).toBeTruthy();
    // What the late instance saves (sealed with k1, its own) replays on the others.
    const own = randomUUID();
    const first = await late.send(own);
    expect(first.status).toBe(201);
    const again = await current.send(own);
    expect(again.status).toBe(201);
    expect(await again.text()).toBe(await first.text());
    await late.store.retire();
  });
});
