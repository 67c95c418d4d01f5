/**
 * Encryption at rest (issue 13, "Sensitive inputs"): the atomic store with a sealer on every driver
 * (the sealer itself: test/core/sealing.test.ts): what is in the table is not the reply, a replay is the
 * reply byte for byte, keys rotate without downtime, a tampered body is an error, and rows written in
 * clear before encryption was turned on still replay.
 */
import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  AesGcmSealer,
  type Claim,
  fingerprint,
  isSealed,
  SealedValueError,
  type StoredResponse,
} from "../../src/core/index.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { backends, type OpenDb } from "../helpers/db.ts";

const enc = new TextEncoder();
const k1 = { id: "k1", key: randomBytes(32) };
const k2 = { id: "k2", key: randomBytes(32) };

function claimOf(key: string): Claim {
  const body = enc.encode(`{"key":"${key}"}`);
  return {
    scope: "acct_1",
    key,
    fingerprint: fingerprint({ method: "POST", path: "/v1/payments", contentType: "application/json", body }),
  };
}

/** A reply holding a card-like secret, and a work function that counts its runs. */
function reply(key: string): StoredResponse {
  return {
    status: 201,
    headers: [["content-type", "application/json"]],
    body: enc.encode(JSON.stringify({ key, card: "4242424242424242", id: randomBytes(8).toString("hex") })),
  };
}

describe.each(backends)("the atomic store with a sealer on $name", (backend) => {
  let open: OpenDb;
  let runs = 0;
  /** Every store opened so far: "instances" that a key promotion waits for until they retire. */
  const opened: PostgresStore[] = [];
  const storeWith = async (...keys: Array<typeof k1>) => {
    const store = await PostgresStore.open(
      open.db,
      keys.length > 0 ? { sealer: new AesGcmSealer(keys) } : {},
    );
    opened.push(store);
    return store;
  };
  const work = (response: StoredResponse) => async () => {
    runs++;
    return { response, save: response };
  };
  const mustNotRun = async (): Promise<never> => {
    throw new Error("the work ran again");
  };
  const rawBody = async (key: string) =>
    (
      await open.db.query<{ body: Uint8Array }>("SELECT body FROM idem.keys WHERE key = $1 AND NOT marker", [
        key,
      ])
    ).rows[0]!.body;

  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
  });
  afterAll(async () => {
    await open?.close();
  });

  it("seals the saved headers with the body: the Location's id is not in clear, and replays whole", async () => {
    const store = await storeWith(k1);
    const r = {
      ...reply("located"),
      headers: [
        ["content-type", "application/json"],
        ["location", "/v1/payments/pay_s3cr3t"],
      ] as Array<[string, string]>,
    };
    await store.atomic(claimOf("located"), work(r));
    const { rows } = await open.db.query<{ headers: string }>(
      "SELECT headers::text AS headers FROM idem.keys WHERE key = 'located' AND NOT marker",
    );
    expect(rows[0]!.headers).not.toContain("pay_s3cr3t");
    expect(rows[0]!.headers).toMatch(/^"sealed:v1:/);
    const replay = await store.atomic(claimOf("located"), mustNotRun);
    expect(replay.response.headers).toEqual(r.headers);
    expect((await store.inspect("acct_1", "located"))?.saved?.headers).toEqual(r.headers);
    // A store without the key still answers the inspection, without the headers it cannot open.
    await expect((await storeWith(k2)).inspect("acct_1", "located")).resolves.toMatchObject({
      saved: { headers: [] },
    });
  });

  it("stores a sealed body and replays the reply byte for byte", async () => {
    const store = await storeWith(k1);
    const r = reply("sealed");
    const first = await store.atomic(claimOf("sealed"), work(r));
    expect(first.kind).toBe("executed");
    const raw = Buffer.from(await rawBody("sealed"));
    expect(isSealed(raw)).toBe(true);
    expect(raw.includes(Buffer.from("4242424242424242"))).toBe(false);
    expect(raw.equals(Buffer.from(r.body))).toBe(false);
    const again = await store.atomic(claimOf("sealed"), mustNotRun);
    expect(again.kind).toBe("replayed");
    expect(Buffer.from(again.response.body).equals(Buffer.from(r.body))).toBe(true);
    expect(again.response.headers).toEqual(r.headers);
    expect((await store.inspect("acct_1", "sealed"))?.saved?.bodyBytes).toBe(r.body.length);
  });

  it("rotates: k1's keys replay once k2 is promoted (k1 kept), and fail clearly once k1 is dropped", async () => {
    const before = reply("rot-old");
    await (await storeWith(k1)).atomic(claimOf("rot-old"), work(before));
    const rotated = await storeWith(k2, k1);
    const replay = await rotated.atomic(claimOf("rot-old"), mustNotRun);
    expect(Buffer.from(replay.response.body).equals(Buffer.from(before.body))).toBe(true);
    // Listed first, k2 only opens until promoted; promoted once no running store lacks it.
    await rotated.atomic(claimOf("rot-mid"), work(reply("rot-mid")));
    expect(
      Buffer.from(await rawBody("rot-mid"))
        .subarray(6, 8)
        .toString(),
    ).toBe("k1");
    await expect(rotated.promoteSealingKey("k2")).rejects.toThrow(/running instance\(s\) cannot open it/);
    for (const store of opened) if (store !== rotated) await store.retire();
    await rotated.promoteSealingKey("k2");
    const after = reply("rot-new");
    await rotated.atomic(claimOf("rot-new"), work(after));
    const header = Buffer.from(await rawBody("rot-new")).subarray(0, 8);
    expect(header.subarray(6, 8).toString()).toBe("k2"); // new values name the new key

    const dropped = await storeWith(k2);
    const err = await dropped.atomic(claimOf("rot-old"), mustNotRun).catch((e) => e);
    expect(err).toBeInstanceOf(SealedValueError);
    expect(String(err.message)).toMatch(/key "k1", which is not configured/);
    const fine = await dropped.atomic(claimOf("rot-new"), mustNotRun);
    expect(Buffer.from(fine.response.body).equals(Buffer.from(after.body))).toBe(true);
  });

  it("a tampered body is an error, never a replay of garbage, and runs nothing", async () => {
    const store = await storeWith(k1);
    await store.atomic(claimOf("tampered"), work(reply("tampered")));
    await open.db.query(
      "UPDATE idem.keys SET body = set_byte(body, 40, get_byte(body, 40) # 1) WHERE key = $1 AND NOT marker",
      ["tampered"],
    );
    const ran = runs;
    await expect(store.atomic(claimOf("tampered"), work(reply("x")))).rejects.toBeInstanceOf(
      SealedValueError,
    );
    expect(runs).toBe(ran);
  });

  it("replays rows written in clear before encryption was turned on", async () => {
    const r = reply("clear");
    await (await storeWith()).atomic(claimOf("clear"), work(r));
    expect(Buffer.from(await rawBody("clear")).equals(Buffer.from(r.body))).toBe(true);
    const replay = await (await storeWith(k1)).atomic(claimOf("clear"), mustNotRun);
    expect(replay.kind).toBe("replayed");
    expect(Buffer.from(replay.response.body).equals(Buffer.from(r.body))).toBe(true);
  });

  it("a store without a sealer refuses a sealed row instead of replaying ciphertext", async () => {
    await (await storeWith(k1)).atomic(claimOf("no-sealer"), work(reply("no-sealer")));
    await expect((await storeWith()).atomic(claimOf("no-sealer"), mustNotRun)).rejects.toThrow(
      /opened without a sealer/,
    );
  });
});
