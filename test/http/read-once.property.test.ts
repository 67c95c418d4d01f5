/**
 * Property tests of the read-once path (src/core/body.ts + fingerprint.ts): two requests with equal
 * fingerprints hand the handler the same value; a body that can be read two ways is refused.
 * Requests are generated in families that collide on purpose (the same fields reordered, re-spaced,
 * re-escaped, repeated), so equal fingerprints are common, not luck.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { fingerprintRequest, IdemError, type RequestBody, readRequestBody } from "../../src/core/index.ts";

const encoder = new TextEncoder();

/** Deep equality as a handler sees values: numbers by ===, bytes by content, own keys only. */
function same(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (a instanceof Uint8Array && b instanceof Uint8Array) return Buffer.from(a).equals(Buffer.from(b));
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  if (ka.length !== kb.length) return false;
  return ka.every((k) => Object.hasOwn(b, k) && same((a as never)[k], (b as never)[k]));
}

function read(
  contentType: string,
  text: string | Uint8Array,
  repeatable?: string[],
): RequestBody | IdemError {
  try {
    return readRequestBody(contentType, typeof text === "string" ? encoder.encode(text) : text, {
      repeatable,
    });
  } catch (err) {
    if (err instanceof IdemError) return err;
    throw err; // anything else would be a 500
  }
}

const names = fc.constantFrom("amount_cents", "currency", "card", "a", "\u0061", "tag", "__proto__", "é", "");
const scalar = fc.oneof(
  fc.integer(),
  fc.constantFrom(0, -0, 1.5, 1e21, 100, 2 ** 53 + 2),
  fc.string({ maxLength: 6 }),
  fc.boolean(),
  fc.constant(null),
);

/** How one body is written: member order, spacing, escapes, percent-encoding. */
const style = fc.record({
  space: fc.constantFrom("", " ", "\n  "),
  escape: fc.boolean(),
  reverse: fc.boolean(),
  encodeAll: fc.boolean(),
});
type Style = { space: string; escape: boolean; reverse: boolean; encodeAll: boolean };

const jsonMembers = fc.array(
  fc.tuple(names, fc.oneof(scalar, fc.dictionary(names, scalar, { maxKeys: 3 }))),
  {
    maxLength: 5,
  },
);
const formPairs = fc.array(fc.tuple(names, fc.string({ maxLength: 5 })), { maxLength: 5 });

/** A JSON object text whose members may repeat a key. */
function jsonText(members: Array<[string, unknown]>, s: Style): string {
  const key = (k: string) =>
    s.escape
      ? `"${[...k].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`).join("")}"`
      : JSON.stringify(k);
  const list = s.reverse ? [...members].reverse() : members;
  return `{${list.map(([k, v]) => `${s.space}${key(k)}${s.space}:${s.space}${JSON.stringify(v)}`).join(",")}}`;
}

/** A form body whose fields may repeat. */
function formText(pairs: Array<[string, string]>, s: Style): string {
  const enc = (v: string) =>
    s.encodeAll
      ? [...encoder.encode(v)].map((b) => `%${b.toString(16).padStart(2, "0")}`).join("")
      : encodeURIComponent(v);
  const list = s.reverse ? [...pairs].reverse() : pairs;
  return list.map(([k, v]) => `${enc(k)}=${enc(v)}`).join("&");
}

type Req = { ct: string; body: string | Uint8Array };
const JSON_CT = "application/json";
const FORM_CT = "application/x-www-form-urlencoded";

/** Pairs of requests: the same fields written two ways (they collide on purpose), or two at random. */
const pair: fc.Arbitrary<[Req, Req]> = fc.oneof(
  fc.tuple(jsonMembers, style, style).map(([m, a, b]): [Req, Req] => [
    { ct: JSON_CT, body: jsonText(m, a) },
    { ct: JSON_CT, body: jsonText(m, b) },
  ]),
  fc.tuple(formPairs, style, style).map(([p, a, b]): [Req, Req] => [
    { ct: FORM_CT, body: formText(p, a) },
    { ct: FORM_CT, body: formText(p, b) },
  ]),
  fc
    .tuple(
      fc.constantFrom(JSON_CT, FORM_CT, "text/plain"),
      fc.uint8Array({ maxLength: 6 }),
      fc.uint8Array({ maxLength: 6 }),
    )
    .map(([ct, a, b]): [Req, Req] => [
      { ct, body: a },
      { ct, body: b },
    ]),
);

describe("the read-once path", () => {
  it("hands the handler the same value whenever two requests have the same fingerprint", () => {
    let equalFingerprints = 0;
    fc.assert(
      fc.property(pair, fc.boolean(), ([a, b], tags) => {
        const repeatable = tags ? ["tag"] : undefined;
        const ra = read(a.ct, a.body, repeatable);
        const rb = read(b.ct, b.body, repeatable);
        if (ra instanceof IdemError || rb instanceof IdemError) {
          for (const r of [ra, rb]) if (r instanceof IdemError) expect(r.status).toBe(400);
          return;
        }
        const fa = fingerprintRequest("POST", "/v1/payments", ra);
        const fb = fingerprintRequest("POST", "/v1/payments", rb);
        if (Buffer.from(fa).equals(Buffer.from(fb))) {
          equalFingerprints++;
          expect(same(ra.value, rb.value)).toBe(true);
        }
      }),
      { numRuns: 3_000 },
    );
    expect(equalFingerprints).toBeGreaterThan(300); // the property was tested, not vacuously true
  });

  it("gives equal fingerprints to the same fields written differently (reordered, re-spaced, re-escaped)", () => {
    fc.assert(
      fc.property(
        fc.dictionary(fc.string({ maxLength: 4 }), scalar, { maxKeys: 5 }),
        fc.boolean(),
        (fields, escaped) => {
          const entries = Object.entries(fields);
          const text = (list: typeof entries, sp: string) =>
            `{${list.map(([k, v]) => `${sp}${escaped ? JSON.stringify(k).replace(/[a-z]/g, (c) => `\\u00${c.charCodeAt(0).toString(16)}`) : JSON.stringify(k)}:${JSON.stringify(v)}`).join(",")}}`;
          const ra = read("application/json", text(entries, ""));
          const rb = read("application/json", text([...entries].reverse(), " "));
          expect(ra).not.toBeInstanceOf(IdemError);
          expect(fingerprintRequest("POST", "/p", ra as RequestBody)).toEqual(
            fingerprintRequest("POST", "/p", rb as RequestBody),
          );
        },
      ),
      { numRuns: 500 },
    );
  });

  it("refuses a repeated key or field unless the field is declared repeatable (then its order counts)", () => {
    expect(read("application/json", '{"a":1,"b":{"c":1,"c":2}}')).toMatchObject({ code: "ambiguous-body" });
    expect(read("application/json", '{"a":1,"\\u0061":2}')).toMatchObject({ code: "ambiguous-body" });
    expect(read("application/x-www-form-urlencoded", "amount_cents=5000&amount_cents=100")).toMatchObject({
      code: "ambiguous-body",
    });
    const one = read("application/x-www-form-urlencoded", "tag=x&amount=1&tag=y", ["tag"]) as RequestBody;
    const two = read("application/x-www-form-urlencoded", "tag=y&amount=1&tag=x", ["tag"]) as RequestBody;
    expect(one.value).toEqual({ tag: ["x", "y"], amount: "1" });
    expect(fingerprintRequest("POST", "/p", one)).not.toEqual(fingerprintRequest("POST", "/p", two));
  });

  it("refuses JSON that is not JSON, too large a number, too deep a nesting, and bytes that are not UTF-8", () => {
    for (const text of ['{"a":1,}', "{'a':1}", '{"a":1e999}', `${"[".repeat(300)}${"]".repeat(300)}`]) {
      expect(read("application/json", text)).toMatchObject({ status: 400 });
    }
    expect(read("application/json", new Uint8Array([0x7b, 0xff, 0x7d]))).toMatchObject({
      code: "invalid-body",
    });
    expect(read("application/json", '[1,[2,{}],"\\u00e9"]')).toMatchObject({
      kind: "json",
      value: [1, [2, {}], "é"],
    });
  });
});
