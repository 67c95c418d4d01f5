/**
 * What is saved and what a replay carries (issue 21): the save policy's status boundaries and the
 * header allow-list, through the public `isSaved` / `filterHeaders` and over HTTP.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DEFAULT_REPLAYED_HEADERS, filterHeaders, isSaved } from "../../src/core/index.ts";
import { type RulesApp, startRulesApp } from "./app.ts";

describe("which answers are saved", () => {
  it("2xx always; 1xx and 3xx never", () => {
    expect([199, 200, 201, 299, 300, 302].map((s) => isSaved(s))).toEqual([
      false,
      true,
      true,
      true,
      false,
      false,
    ]);
  });

  it("402 by default; saveStatuses replaces the default list", () => {
    expect(isSaved(402)).toBe(true);
    expect(isSaved(409)).toBe(false);
    expect(isSaved(402, { saveStatuses: [409] })).toBe(false);
    expect(isSaved(409, { saveStatuses: [409] })).toBe(true);
  });

  it("5xx only with saveServerErrors, and never a 4xx by that option", () => {
    expect(isSaved(500)).toBe(false);
    expect(isSaved(503, { saveServerErrors: false })).toBe(false);
    expect(isSaved(500, { saveServerErrors: true })).toBe(true);
    expect(isSaved(599, { saveServerErrors: true })).toBe(true);
    expect(isSaved(499, { saveServerErrors: true })).toBe(false);
  });
});

describe("which headers a replay carries", () => {
  const sent: Array<[string, string]> = [
    ["Content-Type", "application/json"],
    ["Location", "/v1/payments/1"],
    ["X-Request-Id", "r1"],
    ["Set-Cookie", "session=abc"],
    ["ETag", '"v1"'],
  ];

  it("the default allow-list, names in lower case, order kept", () => {
    expect(DEFAULT_REPLAYED_HEADERS).toContain("location");
    expect(filterHeaders(sent)).toEqual([
      ["content-type", "application/json"],
      ["location", "/v1/payments/1"],
      ["etag", '"v1"'],
    ]);
  });

  it("a custom allow-list, in any case, replaces the default", () => {
    expect(filterHeaders(sent, ["X-REQUEST-ID"])).toEqual([["x-request-id", "r1"]]);
  });

  it("Set-Cookie is never replayed, even when allowed", () => {
    expect(filterHeaders(sent, ["set-cookie", "Set-Cookie2", "etag"])).toEqual([["etag", '"v1"']]);
    expect(filterHeaders([["set-cookie2", "a=b"]], ["set-cookie2"])).toEqual([]);
  });
});

describe("saving and replaying over HTTP", () => {
  let app: RulesApp;
  beforeAll(async () => {
    app = await startRulesApp({
      "/v1": {},
      "/strict": { saveStatuses: [] },
      "/stripe": { saveServerErrors: true },
      "/custom": { replayHeaders: ["x-receipt", "set-cookie"] },
    });
  });
  afterAll(() => app?.close());

  const send = (path: string, key: string, status: number, headers: Record<string, string> = {}) =>
    app.send(path, {
      key,
      body: "{}",
      headers: {
        "content-type": "application/json",
        "x-status": String(status),
        "x-reply-headers": JSON.stringify(headers),
      },
    });

  /** Send twice under one key; whether the handler ran twice. */
  async function twice(path: string, key: string, status: number) {
    const before = app.runs();
    const first = await send(path, key, status);
    const second = await send(path, key, status);
    return { first, second, ranTwice: app.runs() - before === 2 };
  }

  it("a 200 and a 299 are saved; a 300 and a 199-range answer are not", async () => {
    expect((await twice("/v1/a", "r-200", 200)).ranTwice).toBe(false);
    expect((await twice("/v1/a", "r-299", 299)).ranTwice).toBe(false);
    expect((await twice("/v1/a", "r-300", 300)).ranTwice).toBe(true);
  });

  it("a 402 decline is saved and replayed as not applied; without it in saveStatuses it is not saved", async () => {
    const { second, ranTwice } = await twice("/v1/a", "r-402", 402);
    expect(ranTwice).toBe(false);
    expect(second.status).toBe(402);
    expect(second.headers.get("idempotent-replayed")).toBe("true");
    expect(second.headers.get("idempotency-operation-state")).toBe("failed_not_applied");
    expect((await twice("/strict/a", "r-402s", 402)).ranTwice).toBe(true);
  });

  it("a 500 is not saved (the same key runs again) unless saveServerErrors, as Stripe does", async () => {
    expect((await twice("/v1/a", "r-500", 500)).ranTwice).toBe(true);
    const stripe = await twice("/stripe/a", "r-500s", 500);
    expect(stripe.ranTwice).toBe(false);
    expect(stripe.second.status).toBe(500);
    expect(stripe.second.headers.get("idempotent-replayed")).toBe("true");
  });

  it("the replay carries the allow-listed headers only, never the first caller's cookie", async () => {
    const headers = {
      location: "/v1/payments/9",
      "x-receipt": "rc_1",
      "set-cookie": "session=first",
      "content-language": "de",
      "content-location": "/v1/payments/9.json",
      "content-disposition": "inline",
      etag: '"v9"',
      "last-modified": "Mon, 30 Nov 2026 12:00:00 GMT",
      "cache-control": "no-store",
      link: "</v1/payments/9/refunds>; rel=refunds",
    };
    const first = await send("/v1/h", "r-h", 201, headers);
    expect(first.headers.get("set-cookie")).toBe("session=first");
    const replay = await send("/v1/h", "r-h", 201, headers);
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(replay.headers.get("location")).toBe("/v1/payments/9");
    expect(replay.headers.get("content-type")).toBe("application/json");
    for (const name of [
      "content-language",
      "content-location",
      "content-disposition",
      "etag",
      "last-modified",
      "cache-control",
      "link",
    ] as const) {
      expect(replay.headers.get(name), name).toBe(headers[name]);
    }
    expect(replay.headers.get("x-receipt")).toBeNull();
    expect(replay.headers.get("set-cookie")).toBeNull();

    await send("/custom/h", "r-hc", 201, headers);
    const custom = await send("/custom/h", "r-hc", 201, headers);
    expect(custom.headers.get("x-receipt")).toBe("rc_1");
    expect(custom.headers.get("location")).toBeNull();
    expect(custom.headers.get("set-cookie")).toBeNull();
  });
});
