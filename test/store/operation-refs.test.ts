/**
 * Operation references (core/operation-ref.ts, postgres/ref-keys.ts): opaque to whoever reads one,
 * unforgeable, the same for the same claim, and still opening after a restart and across a rotation of
 * the encryption keys, for as long as the key they name is kept. Over a real store on each backend.
 */
import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AesGcmSealer, OperationRefs, type SealingKey } from "../../src/core/index.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { backends, type OpenDb } from "../helpers/db.ts";

const CLAIM = "0190f5b2-7c1e-7a8e-9a51-3c2d1e0f9a7b"; // a UUIDv7: its first 48 bits are its time
const k1: SealingKey = { id: "k1", key: randomBytes(32) };
const k2: SealingKey = { id: "k2", key: randomBytes(32) };

/** Every way a log reader could look for the scope, the key or the claim in a reference. */
function readable(ref: string, values: string[]): string[] {
  const raw = Buffer.from(ref.slice(3), "base64url");
  const views = [ref, raw.toString("latin1"), raw.toString("hex"), raw.toString("utf8")];
  const found: string[] = [];
  for (const v of values) {
    const forms = [v, Buffer.from(v).toString("hex"), v.replaceAll("-", "")];
    if (views.some((view) => forms.some((f) => view.includes(f)))) found.push(v);
  }
  return found;
}

describe("OperationRefs", () => {
  const refs = new OperationRefs([{ id: "a", secret: randomBytes(32) }]);

  it("round-trips a claim; the same claim always gets the same reference, another claim another", () => {
    for (const [scope, key] of [
      ["acct_1", "k"],
      ["a/b", '"quoted"\\'],
      ["é", "x".repeat(255)],
    ] as const) {
      const ref = refs.encode(scope, key, CLAIM);
      expect(ref.startsWith("op_")).toBe(true);
      expect(refs.decode(ref)).toEqual({ scope, key, claimId: CLAIM });
      expect(refs.encode(scope, key, CLAIM)).toBe(ref);
      expect(refs.encode(scope, key, "1190f5b2-7c1e-4a8e-9a51-3c2d1e0f9a7b")).not.toBe(ref);
      expect(refs.decode(refs.encode(scope, key))).toEqual({ scope, key });
      expect(refs.encode(scope, key, null)).toBe(refs.encode(scope, key));
    }
  });

  it("seals the same bytes as ever: references handed out before still name their claim", () => {
    // Made with the codec of 4 Dec 2026 (createHmac for the IV); a retry's answer must carry the
    // reference the first attempt's did, across a deploy.
    const fixed = new OperationRefs([
      { id: "golden", secret: Uint8Array.from({ length: 32 }, (_, i) => i + 1) },
    ]);
    expect(fixed.encode("acct_é", "k-ü-1", "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")).toBe(
      "op_AQZnb2xkZW6Zndi-lzNcOpCNR9z-cg5eSdaL4js4JCRdSzYrK_n0ghUh8wZQePqSlSFluU3Fekk3dFWsAGW2UXlaZMA",
    );
    expect(fixed.encode("acct_é", "k-ü-1")).toBe(
      "op_AQZnb2xkZW6cl3Mm_ZMhyRB4JCG2FFmrRVKgBTWj5D4nqmU0e0wMBnPMmmPf0VKKMVUyIQ",
    );
    expect(() => fixed.encode("acct", "k", "not-a-uuid")).toThrow(RangeError);
  });

  it("seals with the secret current at each call, whatever it sealed the same claim with before", () => {
    let current = "a";
    const two = new OperationRefs(
      [
        { id: "a", secret: randomBytes(32) },
        { id: "b", secret: randomBytes(32) },
      ],
      () => current,
    );
    const withA = two.encode("acct", "k", CLAIM);
    current = "b";
    const withB = two.encode("acct", "k", CLAIM);
    expect(withB).not.toBe(withA);
    expect(two.decode(withB)).toEqual({ scope: "acct", key: "k", claimId: CLAIM });
    current = "a";
    expect(two.encode("acct", "k", CLAIM)).toBe(withA);
    // Scope and key are told apart however they split.
    expect(two.encode("ab", "c", CLAIM)).not.toBe(two.encode("a", "bc", CLAIM));
    expect(two.decode(two.encode("a", "bc", CLAIM))).toEqual({ scope: "a", key: "bc", claimId: CLAIM });
  });

  it("carries nothing a reader can use: not the account, not the key, not the claim id", () => {
    const scope = "acct_4711";
    const key = "order-2026-05-06-0001";
    const ref = refs.encode(scope, key, CLAIM);
    expect(readable(ref, [scope, key, CLAIM, CLAIM.slice(0, 13)])).toEqual([]);
    // Two claims of similar keys share no visible part beyond the prefix and the key id.
    const other = refs.encode(scope, `${key.slice(0, -1)}2`, CLAIM);
    expect(other.slice(8, 40)).not.toBe(ref.slice(8, 40));
  });

  it("opens nothing malformed, altered, truncated, made up, or sealed with another secret", () => {
    const ref = refs.encode("acct", "k", CLAIM);
    const raw = Buffer.from(ref.slice(3), "base64url");
    const bad: string[] = [
      "",
      "op_",
      "xx_abc",
      ref.replace("op_", "OP_"),
      `${ref}=`,
      ref.slice(0, -1),
      `op_${raw.subarray(0, raw.length - 1).toString("base64url")}`,
      `op_${"A".repeat(4000)}`,
      `op_${Buffer.from(JSON.stringify(["acct", "k\u0000"])).toString("base64url")}`, // the old form
      new OperationRefs([{ id: "a", secret: randomBytes(32) }]).encode("acct", "k", CLAIM),
    ];
    for (let i = 0; i < raw.length; i++) {
      const flipped = Buffer.from(raw);
      flipped[i]! ^= 0x01;
      bad.push(`op_${flipped.toString("base64url")}`);
    }
    for (const b of bad) expect(refs.decode(b), b).toBeUndefined();
  });
});

describe.each(backends)("a store's references on $name", (backend) => {
  let open: OpenDb;
  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
  });
  afterAll(async () => {
    await open?.close();
  });

  it("keep opening after a restart, on every instance, without any configuration", async () => {
    const a = await PostgresStore.open(open.db);
    const b = await PostgresStore.open(open.db); // another instance, or the same after a restart
    const ref = a.refs.encode("acct", "k", CLAIM);
    expect(b.refs.decode(ref)).toEqual({ scope: "acct", key: "k", claimId: CLAIM });
    expect(b.refs.encode("acct", "k", CLAIM)).toBe(ref);
    // Another database's store (another secret) opens none of them.
    const other = await backend.open();
    try {
      await migrate(other.db);
      expect((await PostgresStore.open(other.db)).refs.decode(ref)).toBeUndefined();
    } finally {
      await other.close();
    }
  });

  it("follow the encryption keys' rotation: sealed with the promoted key, old ones opening while kept", async () => {
    const plain = await PostgresStore.open(open.db);
    const before = plain.refs.encode("acct", "k", CLAIM); // the database's own secret
    const withK1 = await PostgresStore.open(open.db, { sealer: new AesGcmSealer([k1]) });
    await withK1.promoteSealingKey("k1");
    const r1 = withK1.refs.encode("acct", "k", CLAIM);
    expect(r1).not.toBe(before);
    expect(withK1.refs.decode(before)).toMatchObject({ key: "k" }); // made before encryption was on

    // Step 1 of a rotation: k2 rolled out everywhere; step 2: promoted. Then k1 kept for the retention.
    const rolled = await PostgresStore.open(open.db, { sealer: new AesGcmSealer([k2, k1]) });
    await withK1.retire();
    await plain.retire();
    await rolled.promoteSealingKey("k2");
    const r2 = rolled.refs.encode("acct", "k", CLAIM);
    expect(r2).not.toBe(r1);
    for (const ref of [before, r1, r2]) expect(rolled.refs.decode(ref)).toMatchObject({ claimId: CLAIM });
    // Once k1 is dropped (its values expired), what it sealed no longer opens: a 404 like any other.
    const dropped = await PostgresStore.open(open.db, { sealer: new AesGcmSealer([k2]) });
    expect(dropped.refs.decode(r1)).toBeUndefined();
    expect(dropped.refs.decode(r2)).toMatchObject({ key: "k" });
    expect(dropped.refs.decode(before)).toMatchObject({ key: "k" });
    for (const s of [rolled, dropped]) await s.retire();
  });
});
