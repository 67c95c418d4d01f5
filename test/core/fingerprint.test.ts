/**
 * What makes two requests "the same request" (issue 21): the fingerprint through the public API, and
 * over HTTP, where the same key on a different request is a 422 and the same request is a replay.
 */
import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type FingerprintInput, fieldsFingerprint, fingerprint } from "../../src/core/index.ts";
import { keyLockId } from "../../src/postgres/store.ts";
import { type RulesApp, startRulesApp } from "./app.ts";

const enc = new TextEncoder();
const req = (over: Partial<FingerprintInput> & { text?: string }): FingerprintInput => ({
  method: over.method ?? "POST",
  path: over.path ?? "/v1/payments",
  contentType: over.contentType === undefined ? "application/json" : over.contentType,
  body: over.body ?? enc.encode(over.text ?? '{"amount_cents":100}'),
});
const fp = (over: Partial<FingerprintInput> & { text?: string }) =>
  Buffer.from(fingerprint(req(over))).toString("hex");

describe("the fingerprint", () => {
  it("is a SHA-256 (32 bytes) and the same for the same request", () => {
    expect(fingerprint(req({}))).toHaveLength(32);
    expect(fp({})).toBe(fp({}));
  });

  it("query parameters count, in any order", () => {
    expect(fp({ path: "/v1/p?a=1&b=2" })).toBe(fp({ path: "/v1/p?b=2&a=1" }));
    expect(fp({ path: "/v1/p?a=1" })).not.toBe(fp({ path: "/v1/p?a=2" }));
    expect(fp({ path: "/v1/p?a=1" })).not.toBe(fp({ path: "/v1/p" }));
    expect(fp({ path: "/v1/p?a=1&a=2" })).not.toBe(fp({ path: "/v1/p?a=1" }));
    expect(fp({ path: "/v1/p?" })).toBe(fp({ path: "/v1/p" }));
    // a repeated parameter's values keep their order (a list), whatever the other parameters' order
    expect(fp({ path: "/v1/p?a=1&a=2" })).not.toBe(fp({ path: "/v1/p?a=2&a=1" }));
    expect(fp({ path: "/v1/p?b=0&a=1&a=2" })).toBe(fp({ path: "/v1/p?a=1&b=0&a=2" }));
    expect(fp({ path: "/v1/p?b=1&a=2&c=3" })).toBe(fp({ path: "/v1/p?c=3&a=2&b=1" }));
  });

  it("the method counts, in any case; the path counts", () => {
    expect(fp({ method: "post" })).toBe(fp({ method: "POST" }));
    expect(fp({ method: "PUT" })).not.toBe(fp({ method: "POST" }));
    expect(fp({ path: "/v1/refunds" })).not.toBe(fp({ path: "/v1/payments" }));
  });

  it("JSON is compared by value: key order and spacing do not count, arrays are not objects", () => {
    expect(fp({ text: '{"a":1,"b":2}' })).toBe(fp({ text: '{ "b": 2, "a": 1 }' }));
    expect(fp({ text: '{"a":1}' })).not.toBe(fp({ text: '{"a":2}' }));
    expect(fp({ text: "[1,2]" })).not.toBe(fp({ text: '{"0":1,"1":2}' }));
  });

  it("the same bytes as JSON and as text/plain are different requests", () => {
    const bytes = '{"amount_cents":100}';
    expect(fp({ text: bytes, contentType: "application/json" })).not.toBe(
      fp({ text: bytes, contentType: "text/plain" }),
    );
  });

  it("a body the reader refuses is compared as its raw bytes", () => {
    const bad = fp({ text: "{not json", contentType: "application/json" });
    expect(bad).toBe(fp({ text: "{not json", contentType: "application/octet-stream" }));
    expect(bad).not.toBe(fp({ text: "{not json!", contentType: "application/json" }));
  });

  it("selected fields: only those fields (and the method and path) count", () => {
    const f = (method: string, path: string, fields: Record<string, unknown>) =>
      Buffer.from(fieldsFingerprint(method, path, fields)).toString("hex");
    expect(f("post", "/p?b=1&a=2", { x: 1, y: 2 })).toBe(f("POST", "/p?a=2&b=1", { y: 2, x: 1 }));
    expect(f("POST", "/p", { x: 1 })).not.toBe(f("POST", "/p", { x: 2 }));
    expect(f("POST", "/p", { x: 1 })).not.toBe(f("PUT", "/p", { x: 1 }));
    expect(f("POST", "/p", { x: 1 })).not.toBe(f("POST", "/q", { x: 1 }));
    expect(f("POST", "/p", { x: 1 })).not.toBe(fp({ method: "POST", path: "/p", text: '{"x":1}' }));
  });
});

describe("the fingerprint over HTTP", () => {
  let app: RulesApp;
  beforeAll(async () => {
    app = await startRulesApp({ "/v1": {}, "/fields": { fingerprint: { fields: ["amount_cents"] } } });
  });
  afterAll(() => app?.close());

  const json = { "content-type": "application/json" };

  it("the same key with the query parameters reordered is a replay", async () => {
    const first = await app.send("/v1/p?a=1&b=2", { key: "fp-q1", body: "{}", headers: json });
    const again = await app.send("/v1/p?b=2&a=1", { key: "fp-q1", body: "{}", headers: json });
    expect(first.status).toBe(201);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(await again.text()).toBe(await first.text());
  });

  it("the same key with another query value is a 422, and nothing runs again", async () => {
    await app.send("/v1/p?a=1", { key: "fp-q2", body: "{}", headers: json });
    const runs = app.runs();
    const other = await app.send("/v1/p?a=2", { key: "fp-q2", body: "{}", headers: json });
    expect(other.status).toBe(422);
    expect(((await other.json()) as { type: string }).type).toBe("urn:idem:problem:idempotency-key-mismatch");
    expect(app.runs()).toBe(runs);
  });

  it("the same key with the same bytes sent as text/plain is a 422", async () => {
    await app.send("/v1/p", { key: "fp-ct", body: '{"a":1}', headers: json });
    const other = await app.send("/v1/p", {
      key: "fp-ct",
      body: '{"a":1}',
      headers: { "content-type": "text/plain" },
    });
    expect(other.status).toBe(422);
  });

  it("a route comparing selected fields replays a retry whose other fields changed, refuses a changed amount", async () => {
    const body = (amount: number, trace: string) => JSON.stringify({ amount_cents: amount, trace });
    const first = await app.send("/fields/p", { key: "fp-f", body: body(100, "t1"), headers: json });
    expect(first.status).toBe(201);
    const retry = await app.send("/fields/p", { key: "fp-f", body: body(100, "t2"), headers: json });
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    const changed = await app.send("/fields/p", { key: "fp-f", body: body(200, "t1"), headers: json });
    expect(changed.status).toBe(422);
  });
});

describe("the fingerprint is stable across versions", () => {
  // Saved keys keep the fingerprint they were saved with, and during a rolling deploy old and new
  // instances answer the same keys: if this layout changes, every saved key becomes a 422 mismatch.
  // SHA-256 of: METHOD \n path (query sorted) \n kind \n canonical body.
  const sha = (text: string) => createHash("sha256").update(text).digest("hex");
  const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");

  it("JSON, form, raw and empty bodies, and selected fields, hash to the documented layout", () => {
    expect(
      fp({ method: "post", path: "/v1/payments?b=2&a=1", text: '{"currency":"eur","amount_cents":100}' }),
    ).toBe(sha('POST\n/v1/payments?a=1&b=2\njson\n{"amount_cents":100,"currency":"eur"}'));
    expect(fp({ contentType: "application/x-www-form-urlencoded", text: "b=2&a=1" })).toBe(
      sha("POST\n/v1/payments\nform\na=1&b=2"),
    );
    expect(fp({ contentType: "text/plain", text: "hello" })).toBe(sha("POST\n/v1/payments\nraw\nhello"));
    expect(fp({ method: "DELETE", path: "/v1/payments/1", text: "" })).toBe(
      sha("DELETE\n/v1/payments/1\nnone\n"),
    );
    expect(hex(fieldsFingerprint("post", "/v1/p?b=2&a=1", { amount_cents: 100 }))).toBe(
      sha('POST\n/v1/p?a=1&b=2\nfields\n{"amount_cents":100}'),
    );
  });

  it("the per-key lock id is the first 8 bytes of SHA-256(scope NUL key), signed", () => {
    // Old and new instances must take the same lock for a key, or two could run it side by side.
    for (const [scope, key] of [
      ["acct_1", "k"],
      ["acct_é", "clé-ü-\u{1F600}"],
      ["", ""],
    ] as const) {
      const first8 = createHash("sha256").update(`${scope}\0${key}`).digest().readBigInt64BE(0);
      expect(keyLockId(scope, key)).toBe(first8.toString());
    }
    expect(keyLockId("acct_1", "k")).toBe(
      BigInt.asIntN(64, BigInt(`0x${sha("acct_1\0k").slice(0, 16)}`)).toString(),
    );
  });
});
