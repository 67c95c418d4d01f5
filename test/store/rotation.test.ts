/**
 * Key rotation while instances roll: two instances of one service on one database, under load, each
 * replaying the other's keys. The documented two-step rollout (add the new key as a second key, which
 * only opens, everywhere; then move it first, which seals with it) never fails a request. Skipping step
 * one (some instances seal with a key the others lack) answers those replays 503 with Retry-After, the
 * same key retryable elsewhere: never a 500.
 */
import { randomBytes, randomUUID } from "node:crypto";
import { Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AesGcmSealer, type SealingKey } from "../../src/core/index.ts";
import { idempotency } from "../../src/http/hono.ts";
import { migrate } from "../../src/postgres/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { backends, type OpenDb } from "../helpers/db.ts";

const k1: SealingKey = { id: "k1", key: randomBytes(32) };
const k2: SealingKey = { id: "k2", key: randomBytes(32) };

describe.each(backends.slice(-1))("rolling key rotation on $name", (backend) => {
  let open: OpenDb;
  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
  });
  afterAll(async () => {
    await open?.close();
  });

  async function instance(keys: SealingKey[]) {
    const store = await PostgresStore.open(open.db, { sealer: new AesGcmSealer(keys) });
    const app = new Hono();
    app.post("/v1/things", idempotency({ store, scope: () => "acct" }), (c) =>
      c.json({ id: randomUUID() }, 201, { location: "/v1/things/1" }),
    );
    return async (key: string): Promise<Response> =>
      app.request("/v1/things", { method: "POST", headers: { "idempotency-key": key }, body: "{}" });
  }

  /** 60 keys, each written by one instance and retried by both, interleaved. */
  async function load(a: (k: string) => Promise<Response>, b: (k: string) => Promise<Response>) {
    const statuses: number[] = [];
    await Promise.all(
      Array.from({ length: 60 }, async (_, i) => {
        const key = randomUUID();
        const [first, second] = i % 2 ? [a, b] : [b, a];
        statuses.push((await first(key)).status, (await second(key)).status, (await first(key)).status);
      }),
    );
    return statuses;
  }

  it("the two-step rollout: step 1 adds k2 as an opening key everywhere, step 2 seals with it: no failure", async () => {
    const old = await instance([k1]);
    const step1 = await instance([k1, k2]); // k2 listed second: it opens, it never seals
    expect(new Set(await load(old, step1))).toEqual(new Set([201]));
    const step2 = await instance([k2, k1]); // promoted on an instance; the others already open k2
    expect(new Set(await load(step1, step2))).toEqual(new Set([201]));
  });

  it("skipping step 1 (sealing with k2 where others lack it): those replays are 503, never 500", async () => {
    const old = await instance([k1]);
    const rushed = await instance([k2, k1]);
    const statuses = await load(old, rushed);
    expect(statuses).not.toContain(500);
    expect(statuses).toContain(503);
    expect(new Set(statuses)).toEqual(new Set([201, 503]));
  });
});
