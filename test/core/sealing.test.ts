/**
 * Encryption at rest (issue 13, "Sensitive inputs"), the sealer itself: its self-describing format, key
 * rotation, what it refuses (tampered, truncated, moved, sealed with a dropped key) and how keys are
 * read from the environment. The stores' use of it is in test/store/sealing.test.ts and
 * test/phases/sealing.test.ts.
 */
import { randomBytes } from "node:crypto";
import { describe, expect, it } from "vitest";
import {
  AesGcmSealer,
  isSealed,
  openBytes,
  openJson,
  plainLength,
  SealedValueError,
  SealingKeyError,
  sealBytes,
  sealContext,
  sealerFromEnv,
  sealJson,
} from "../../src/core/index.ts";

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
    expect(() => dropped.open(old)).toThrow(
      'a value was sealed with key "k1", which is not configured (keys: k2): keep a key until every value sealed with it has expired',
    );
    const err = (() => {
      try {
        dropped.open(old);
      } catch (e) {
        return e as Error;
      }
    })();
    expect(err?.name).toBe("SealedValueError");
    expect(() => new AesGcmSealer([{ id: "k3", key: randomBytes(32) }, k2]).open(old)).toThrow(
      /not configured \(keys: k3, k2\)/,
    );
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

describe("the sealer at its edges", () => {
  const sealer = new AesGcmSealer([k1]);
  const same = (a: Uint8Array, b: Uint8Array) => Buffer.from(a).equals(Buffer.from(b));
  const refusal = (make: () => unknown) => {
    try {
      make();
      return "accepted";
    } catch (e) {
      return `${(e as Error).name}: ${(e as Error).message}`;
    }
  };

  it("seals an empty reply and opens it again (a 204 has no body)", () => {
    const sealed = sealer.seal(new Uint8Array(0), "ctx");
    expect(sealed.length).toBe(6 + 2 + 12 + 16);
    expect(sealer.open(sealed, "ctx").length).toBe(0);
    expect(plainLength(sealed.subarray(0, 6), sealed.length)).toBe(0);
    expect(() => sealer.open(sealed.subarray(0, sealed.length - 1), "ctx")).toThrow(
      new SealedValueError("a sealed value is truncated (35 bytes)", "altered"),
    );
  });

  it("a value sealed without a context opens without one, and with no other", () => {
    const sealed = sealer.seal(enc.encode("x"));
    expect(new TextDecoder().decode(sealer.open(sealed))).toBe("x");
    expect(new TextDecoder().decode(sealer.open(sealed, ""))).toBe("x");
    expect(() => sealer.open(sealed, "ctx")).toThrow(
      new SealedValueError(
        'a value sealed with key "k1" failed authentication: it was altered, or moved from another row',
        "altered",
      ),
    );
  });

  it("reads as plain bytes anything that does not start with the whole magic and version", () => {
    const sealed = sealer.seal(enc.encode("secret"), "ctx");
    for (const at of [0, 1, 2, 3, 4]) {
      const other = Uint8Array.from(sealed);
      other[at]! ^= 0x02;
      expect(isSealed(other), `byte ${at}`).toBe(false);
      expect(sealer.open(other, "ctx"), `byte ${at}`).toBe(other);
      expect(plainLength(other.subarray(0, 6), other.length), `byte ${at}`).toBe(other.length);
    }
    expect(isSealed(sealed.subarray(0, 6))).toBe(true);
    expect(isSealed(sealed.subarray(0, 5))).toBe(false);
    expect(isSealed(null)).toBe(false);
    expect(isSealed(undefined)).toBe(false);
    expect(plainLength(null, 42)).toBe(42);
    // A header whose key id claims more bytes than the value holds: nothing, never a negative length.
    expect(plainLength(Uint8Array.from([0xff, 0x69, 0x64, 0x6d, 1, 200]), 40)).toBe(0);
  });

  it("names the key of each value: a key id of 32 characters, and the current key first", () => {
    const long = { id: "A-z.0_9".padEnd(32, "x"), key: randomBytes(32) };
    const s = new AesGcmSealer([long, k1]);
    expect(s.currentId).toBe(long.id);
    const sealed = s.seal(enc.encode("v"), "ctx");
    expect(sealed[5]).toBe(32);
    expect(Buffer.from(sealed.subarray(6, 38)).toString()).toBe(long.id);
    expect(plainLength(sealed.subarray(0, 6), sealed.length)).toBe(1);
    expect(new TextDecoder().decode(new AesGcmSealer([k1, long]).open(sealed, "ctx"))).toBe("v");
  });

  it("refuses keys it cannot use, saying which and why", () => {
    expect(refusal(() => new AesGcmSealer([]))).toBe("SealingKeyError: AesGcmSealer needs at least one key");
    expect(refusal(() => new AesGcmSealer([{ id: "x".repeat(33), key: k1.key }]))).toBe(
      `SealingKeyError: sealing key id "${"x".repeat(33)}" must be 1-32 characters of A-Z a-z 0-9 _ . -`,
    );
    for (const id of ["", "a b", "é", "k1\n"]) {
      expect(
        refusal(() => new AesGcmSealer([{ id, key: k1.key }])),
        id,
      ).toMatch(/must be 1-32 characters/);
    }
    expect(refusal(() => new AesGcmSealer([k1, { id: "k1", key: k2.key }]))).toBe(
      'SealingKeyError: sealing key id "k1" is given twice',
    );
    for (const n of [31, 33]) {
      expect(refusal(() => new AesGcmSealer([{ id: "k", key: randomBytes(n) }]))).toBe(
        `SealingKeyError: sealing key "k" is ${n} bytes, needs 32 (make one: openssl rand -base64 32)`,
      );
    }
  });

  it("reads keys from any variable, in base64 with or without padding, URL-safe too", () => {
    const url = Buffer.from(k2.key).toString("base64url");
    const s = sealerFromEnv({ MY_KEYS: ` k2:${url} ,k1: ${b64(k1)}` }, "MY_KEYS")!;
    expect(s.ids).toEqual(["k2", "k1"]);
    expect(new TextDecoder().decode(new AesGcmSealer([k2]).open(s.seal(enc.encode("v"))))).toBe("v");
    expect(sealerFromEnv({ IDEM_ENCRYPTION_KEYS: `k1:${b64(k1)}` }, "MY_KEYS")).toBeUndefined();
  });

  it("refuses a malformed variable in one line that names it, clipping what it echoes", () => {
    const env = (value: string) => refusal(() => sealerFromEnv({ MY_KEYS: value }, "MY_KEYS"));
    expect(env(`:${b64(k1)}`)).toBe(
      `SealingKeyError: MY_KEYS: expected id:base64-key pairs separated by commas, got ":${b64(k1).slice(0, 7)}..."`,
    );
    expect(env("abcdefgh")).toBe(
      'SealingKeyError: MY_KEYS: expected id:base64-key pairs separated by commas, got "abcdefgh"',
    );
    expect(env("abcdefghi")).toBe(
      'SealingKeyError: MY_KEYS: expected id:base64-key pairs separated by commas, got "abcdefgh..."',
    );
    for (const bad of [`${b64(k1)}==`, `!${b64(k1)}`, `${b64(k1)}!`, "", "a=b"]) {
      expect(env(`k1:${bad}`), bad).toBe(
        'SealingKeyError: MY_KEYS: key "k1" is not base64 (make one: openssl rand -base64 32)',
      );
    }
    expect(env(`k1:${b64(k1)},k1:${b64(k2)}`)).toBe(
      'SealingKeyError: MY_KEYS: sealing key id "k1" is given twice',
    );
  });

  it("stores bytes in clear without a sealer, and never hands out a sealed value unopened", () => {
    const plain = enc.encode("reply");
    expect(sealBytes(undefined, plain, "ctx")).toBe(plain);
    expect(openBytes(undefined, plain, "ctx")).toBe(plain);
    const sealed = sealBytes(sealer, plain, "ctx");
    expect(isSealed(sealed)).toBe(true);
    expect(same(openBytes(sealer, sealed, "ctx"), plain)).toBe(true);
    expect(() => openBytes(undefined, sealed, "ctx")).toThrow(
      new SealedValueError(
        "a stored value is sealed, but the store was opened without a sealer",
        "key-missing",
      ),
    );
  });

  it("stores a JSON input in clear without a sealer; null for none", () => {
    expect(sealJson(undefined, { a: 1 }, "ctx")).toEqual({ a: 1 });
    expect(sealJson(undefined, undefined, "ctx")).toBeNull();
    expect(openJson(sealer, sealJson(sealer, undefined, "ctx"), "ctx")).toBeNull();
    expect(openJson(sealer, "a string input", "ctx")).toBe("a string input");
    expect(openJson(sealer, null, "ctx")).toBeNull();
    expect(() =>
      openJson(sealer, `sealed:v1:${Buffer.from("not sealed").toString("base64")}`, "ctx"),
    ).toThrow(new SealedValueError("a stored input looks sealed but is not a sealed value", "altered"));
  });

  it("binds a stored value to its key and column: it opens nowhere else", () => {
    const contexts = [
      sealContext("acct_1", "k", "body"),
      sealContext("acct_1", "k", "request"),
      sealContext("acct_1", "k2", "body"),
      sealContext("acct_2", "k", "body"),
      sealContext("acct_1\u00001:acct_1", "k", "body"),
    ];
    expect(new Set(contexts).size).toBe(contexts.length);
    const sealed = sealer.seal(enc.encode("reply"), contexts[0]);
    expect(new TextDecoder().decode(sealer.open(sealed, sealContext("acct_1", "k", "body")))).toBe("reply");
    for (const other of contexts.slice(1)) {
      expect(() => sealer.open(sealed, other), other).toThrow(/failed authentication/);
    }
  });
});
