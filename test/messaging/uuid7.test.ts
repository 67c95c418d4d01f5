import { describe, expect, it } from "vitest";
import { uuidv7 } from "../../src/postgres/uuid7.ts";

describe("uuidv7 (outbox event ids)", () => {
  it("makes unique, strictly increasing RFC 9562 version-7 ids that start with the time", () => {
    const before = Date.now();
    const ids = Array.from({ length: 20_000 }, () => uuidv7());
    expect(new Set(ids).size).toBe(ids.length);
    for (let i = 1; i < ids.length; i++) expect(ids[i]! > ids[i - 1]!).toBe(true);
    for (const id of [ids[0]!, ids[9_999]!, ids[19_999]!]) {
      expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    }
    const ms = Number.parseInt(ids[0]!.replace(/-/g, "").slice(0, 12), 16);
    expect(ms).toBeGreaterThanOrEqual(before);
    expect(ms).toBeLessThanOrEqual(Date.now() + 5); // at most a borrowed millisecond or so ahead
  });

  it("keeps the order when the clock goes back or repeats", () => {
    const a = uuidv7(1_700_000_000_000);
    const b = uuidv7(1_700_000_000_000);
    expect(b > a).toBe(true);
  });
});
