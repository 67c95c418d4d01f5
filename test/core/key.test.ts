/**
 * The Idempotency-Key header rules (issue 21): what a server built on idem accepts as a key and what it
 * answers 400, through the public `parseIdempotencyKey` / `formatIdempotencyKey` and over HTTP.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  formatIdempotencyKey,
  isIdemError,
  KeyInvalidError,
  MAX_KEY_LENGTH,
  parseIdempotencyKey,
} from "../../src/core/index.ts";
import { type RulesApp, startRulesApp } from "./app.ts";

/** The reason a header value is refused, or the key it names. */
function read(value: string | null | undefined): string | undefined {
  try {
    return parseIdempotencyKey(value);
  } catch (err) {
    expect(err).toBeInstanceOf(KeyInvalidError);
    return `refused: ${(err as Error).message}`;
  }
}

const refused = (reason: string) => `refused: The Idempotency-Key header is invalid: ${reason}.`;

describe("the Idempotency-Key header", () => {
  it("absent (null or undefined) means no key, not an error", () => {
    expect(parseIdempotencyKey(null)).toBeUndefined();
    expect(parseIdempotencyKey(undefined)).toBeUndefined();
  });

  it("a bare token is the key, with surrounding whitespace dropped", () => {
    expect(read("8e03978e-40d5-43e8-bc93-6894a57f9324")).toBe("8e03978e-40d5-43e8-bc93-6894a57f9324");
    expect(read("  abc\t")).toBe("abc");
  });

  it("an empty or blank header is refused as empty", () => {
    expect(read("")).toBe(refused("it is empty"));
    expect(read("   ")).toBe(refused("it is empty"));
  });

  it("a quoted key (RFC 8941 sf-string) names the same key as the bare token", () => {
    expect(read('"abc"')).toBe("abc");
    expect(read('  "abc"  ')).toBe("abc");
  });

  it('a quoted key may escape " and \\ and nothing else', () => {
    expect(read('"a\\"b"')).toBe('a"b');
    expect(read('"a\\\\b"')).toBe("a\\b");
    expect(read('"\\"\\\\"')).toBe('"\\');
    expect(read('"a\\nb"')).toBe(refused('a quoted key may only escape " and \\'));
    expect(read('"abc\\')).toBe(refused('a quoted key may only escape " and \\'));
  });

  it("a quoted key with no closing quote is refused", () => {
    expect(read('"abc')).toBe(refused("the quoted key has no closing quote"));
    expect(read('"abc\\"')).toBe(refused("the quoted key has no closing quote"));
    expect(read('"')).toBe(refused("the quoted key has no closing quote"));
  });

  it("a quoted key followed by anything but RFC 8941 parameters is refused", () => {
    const junk = refused("unexpected characters after the quoted key");
    expect(read('"abc"junk')).toBe(junk);
    expect(read('"abc" "def"')).toBe(junk);
    expect(read('"abc";')).toBe(junk);
    expect(read('"abc";V=1')).toBe(junk);
    expect(read('"abc";1v=1')).toBe(junk);
    expect(read('"abc";v=1 junk')).toBe("abc"); // a parameter's value runs to the next ';'
    expect(read('"abc";v=1;;')).toBe(junk);
    expect(read('"abc"x;v=1')).toBe(junk);
  });

  it("RFC 8941 parameters after a quoted key are ignored", () => {
    expect(read('"abc";v=1')).toBe("abc");
    expect(read('"abc"; v=1 ; *w ;x.y-z_0="q"')).toBe("abc");
    expect(read('"abc";flag')).toBe("abc");
    expect(read('"abc" ;v=1')).toBe("abc"); // tolerated: a space before the parameters
  });

  it("a quoted empty key is refused as empty", () => {
    expect(read('""')).toBe(refused("it is empty"));
    expect(read('"";v=1')).toBe(refused("it is empty"));
  });

  it(`a key is 1..${MAX_KEY_LENGTH} characters`, () => {
    expect(MAX_KEY_LENGTH).toBe(255);
    expect(read("k".repeat(255))).toBe("k".repeat(255));
    expect(read(`"${"k".repeat(255)}"`)).toBe("k".repeat(255));
    expect(read("k".repeat(256))).toBe(refused("it is longer than 255 characters"));
    expect(read("!")).toBe("!");
  });

  it("a key is visible ASCII only: no spaces, control characters, DEL or non-ASCII", () => {
    const chars = refused("it may only contain visible ASCII characters (no spaces, no control characters)");
    expect(read("!~")).toBe("!~"); // 0x21 and 0x7E, the ends of the range
    expect(read("a b")).toBe(chars);
    expect(read('"a b"')).toBe(chars);
    expect(read("a\u0001b")).toBe(chars);
    expect(read("a\u007fb")).toBe(chars);
    expect(read("caf\u00e9")).toBe(chars);
    expect(read("\u20ac1")).toBe(chars);
    expect(read('"caf\u00e9"')).toBe(chars);
  });

  it("formatIdempotencyKey writes the sf-string the parser reads back", () => {
    expect(formatIdempotencyKey("abc")).toBe('"abc"');
    expect(formatIdempotencyKey('a"b\\c"')).toBe('"a\\"b\\\\c\\""');
    for (const key of ["abc", 'a"b', "a\\b", '\\"\\"', "k".repeat(255)]) {
      expect(parseIdempotencyKey(formatIdempotencyKey(key))).toBe(key);
    }
  });

  it("formatIdempotencyKey refuses a key the server would refuse", () => {
    for (const bad of ["", "a b", "k".repeat(256), "caf\u00e9"]) {
      expect(() => formatIdempotencyKey(bad)).toThrow(KeyInvalidError);
    }
  });
});

describe("the key over HTTP", () => {
  let app: RulesApp;
  beforeAll(async () => {
    app = await startRulesApp({ "/v1": {} });
  });
  afterAll(() => app?.close());

  const pay = (key: string) =>
    app.send("/v1/payments", {
      key,
      body: '{"amount_cents":100}',
      headers: { "content-type": "application/json" },
    });

  it("a quoted key followed by junk is a 400 problem+json, and nothing runs", async () => {
    const before = app.runs();
    const res = await pay('"k-junk"junk');
    expect(res.status).toBe(400);
    expect(res.headers.get("content-type")).toMatch(/^application\/problem\+json/);
    const problem = (await res.json()) as { type: string; detail: string };
    expect(problem.type).toBe("urn:idem:problem:idempotency-key-invalid");
    expect(problem.detail).toContain("unexpected characters after the quoted key");
    expect(app.runs()).toBe(before);
  });

  it("the quoted form of a key and the bare token are one operation: the second is a replay", async () => {
    const first = await pay('"k-quoted\\\\1"');
    expect(first.status).toBe(201);
    const second = await pay("k-quoted\\1");
    expect(second.status).toBe(201);
    expect(second.headers.get("idempotent-replayed")).toBe("true");
    expect(await second.text()).toBe(await first.text());
  });

  it("a key with a space or a non-ASCII character is a 400 whose detail says why", async () => {
    for (const key of ['"a b"', "caf\u00e9"]) {
      const res = await app.send("/v1/payments", {
        // Headers cannot carry non-Latin-1 text; é is Latin-1 and arrives as one character
        key,
        body: "{}",
        headers: { "content-type": "application/json" },
      });
      expect(res.status).toBe(400);
      const problem = (await res.json()) as { detail: string };
      expect(problem.detail).toContain("visible ASCII");
    }
  });

  it("errors are typed: KeyInvalidError is an IdemError with status 400", () => {
    try {
      parseIdempotencyKey('"x');
      expect.unreachable();
    } catch (err) {
      expect(isIdemError(err)).toBe(true);
      expect((err as KeyInvalidError).status).toBe(400);
    }
  });
});
