/**
 * Encryption at rest (issue 13, "Sensitive inputs"): the sealer's format and key handling, and the
 * atomic store with a sealer on every driver: what is in the table is not the reply, a replay is the
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
  openJson,
  plainLength,
  SealedValueError,
  SealingKeyError,
  type StoredResponse,
  sealerFromEnv,
  sealJson,
} from "../../src/core/index.ts";
import { migrate } from "../../src/postgres/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { backends, type OpenDb } from "../helpers/db.ts";

const enc = new TextEncoder();
const k1 = { id: "k1", key: randomBytes(32) };
const k2 = { id: "k2", key: randomBytes(32) };
const b64 = (k: { key: Uint8Array }) => Buffer.from(k.key).toString("base64");

describe("the AES-256-GCM sealer", () => {
  const sealer = new AesGcmSealer([k1]);
  const plain = enc.encode('{"card":"4242424242424242","amount_cents":5000}');

  it("seals to a self-describing value that holds no plaintext, and opens it again", () => {
    const a = sealer.seal(plain, "ctx");
    const b = sealer.seal(plain, "ctx");
    expect(isSealed(a)).toBe(true);
    expect(Buffer.from(a).includes(Buffer.from("4242"))).toBe(false);
    expect(Buffer.from(a).equals(Buffer.from(b))).toBe(false); // a fresh IV each time
    expect(Buffer.from(sealer.open(a, "ctx")).equals(Buffer.from(plain))).toBe(true);
    expect(plainLength(a.subarray(0, 6), a.length)).toBe(plain.length);
  });

  it("draws a fresh IV for every value, across refills of its pool", () => {
    const ivs = new Set<string>();
    for (let i = 0; i < 2000; i++) ivs.add(Buffer.from(sealer.seal(plain).subarray(8, 20)).toString("hex"));
    expect(ivs.size).toBe(2000);
  });

  it("reads a value that was never sealed as it is", () => {
    expect(isSealed(plain)).toBe(false);
    expect(sealer.open(plain, "ctx")).toBe(plain);
    expect(plainLength(plain.subarray(0, 6), plain.length)).toBe(plain.length);
  });

  it("refuses any altered byte, another context, a truncated value", () => {
    const sealed = sealer.seal(plain, "ctx");
    for (const at of [5, 6, 8, 20, sealed.length - 30, sealed.length - 1]) {
      const bad = Uint8Array.from(sealed);
      bad[at]! ^= 0x01;
      expect(() => sealer.open(bad, "ctx"), `byte ${at}`).toThrow(SealedValueError);
    }
    expect(() => sealer.open(sealed, "another row")).toThrow(/failed authentication/);
    expect(() => sealer.open(sealed.subarray(0, 30), "ctx")).toThrow(/truncated/);
  });

  it("opens values of every configured key, seals with the first, and names a dropped key", () => {
    const old = new AesGcmSealer([k1]).seal(plain);
    const rotated = new AesGcmSealer([k2, k1]);
    expect(rotated.currentId).toBe("k2");
    expect(Buffer.from(rotated.open(old)).equals(Buffer.from(plain))).toBe(true);
    const dropped = new AesGcmSealer([k2]);
    expect(() => dropped.open(old)).toThrow(SealedValueError);
    expect(() => dropped.open(old)).toThrow(/sealed with key "k1", which is not configured \(keys: k2\)/);
  });

  it("keeps a JSON input as one sealed string, and a clear one as it is", () => {
    const input = { card: "4242424242424242", amount_cents: 100 };
    const stored = sealJson(sealer, input, "ctx");
    expect(typeof stored).toBe("string");
    expect(stored as string).toMatch(/^sealed:v1:/);
    expect(stored as string).not.toContain("4242");
    expect(openJson(sealer, stored, "ctx")).toEqual(input);
    expect(openJson(sealer, input, "ctx")).toEqual(input);
    expect(() => openJson(undefined, stored, "ctx")).toThrow(/opened without a sealer/);
  });

  it("reads its keys from the environment, the first one current", () => {
    expect(sealerFromEnv({})).toBeUndefined();
    expect(sealerFromEnv({ IDEM_ENCRYPTION_KEYS: "  " })).toBeUndefined();
    const s = sealerFromEnv({ IDEM_ENCRYPTION_KEYS: `k2:${b64(k2)}, k1:${b64(k1)}` })!;
    expect(s.currentId).toBe("k2");
    expect(s.ids).toEqual(["k2", "k1"]);
    expect(Buffer.from(s.open(new AesGcmSealer([k1]).seal(plain))).equals(Buffer.from(plain))).toBe(true);
  });

  it("says in one line what is wrong with a bad key, never echoing it", () => {
    const secret = b64(k1);
    const cases: Array<[string, RegExp]> = [
      [secret, /IDEM_ENCRYPTION_KEYS: expected id:base64-key pairs/],
      [`k1:${Buffer.alloc(16).toString("base64")}`, /key "k1" is 16 bytes, needs 32/],
      ["k1:not base64!", /key "k1" is not base64/],
      [`k1:${secret},k1:${b64(k2)}`, /id "k1" is given twice/],
      [`bad id:${secret}`, /id "bad id" must be 1-32 characters/],
    ];
    for (const [value, message] of cases) {
      const err = (() => {
        try {
          sealerFromEnv({ IDEM_ENCRYPTION_KEYS: value });
        } catch (e) {
          return e as Error;
        }
      })();
      expect(err, value).toBeInstanceOf(SealingKeyError);
      expect(err!.message).toMatch(message);
      expect(err!.message).not.toContain("\n");
      expect(err!.message).not.toContain(secret);
    }
  });
});

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
  const storeWith = (...keys: Array<typeof k1>) =>
    PostgresStore.open(open.db, keys.length > 0 ? { sealer: new AesGcmSealer(keys) } : {});
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

  it("rotates: k1's keys replay once k2 is current (k1 kept), and fail clearly once k1 is dropped", async () => {
    const before = reply("rot-old");
    await (await storeWith(k1)).atomic(claimOf("rot-old"), work(before));
    const rotated = await storeWith(k2, k1);
    const replay = await rotated.atomic(claimOf("rot-old"), mustNotRun);
    expect(Buffer.from(replay.response.body).equals(Buffer.from(before.body))).toBe(true);
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
