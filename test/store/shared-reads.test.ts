import { describe, expect, it } from "vitest";
import { SharedReads } from "../../src/postgres/keys/shared-reads.ts";
import { latch } from "../helpers/latch.ts";

describe("SharedReads", () => {
  it("gives the calls that come while a key is read that read, and starts a new one once it settled", async () => {
    const reads = new SharedReads<string>();
    let started = 0;
    const [gate, open] = latch();
    const start = async () => {
      started++;
      await gate;
      return `row ${started}`;
    };
    const a = reads.read("k", start);
    const b = reads.read("k", start);
    const other = reads.read("other", async () => "other row");
    expect([a.joined, b.joined, other.joined]).toEqual([false, true, false]);
    expect(started).toBe(1);
    open();
    expect(await Promise.all([a.result, b.result, other.result])).toEqual(["row 1", "row 1", "other row"]);
    expect(reads.size).toBe(0); // gone before any caller resumed
    const later = reads.read("k", start);
    expect(later.joined).toBe(false);
    expect(await later.result).toBe("row 2");
  });

  it("never lets a call join a read whose callers have resumed", async () => {
    const reads = new SharedReads<string[]>();
    const first = reads.read("k", async () => ["row"]);
    const answer = await first.result;
    answer.push("changed by the first caller");
    const after = reads.read("k", async () => ["row"]);
    expect(after.joined).toBe(false);
    expect(await after.result).toEqual(["row"]);
  });

  it("fails every call that shared a failed read, and lets the next call read again", async () => {
    const reads = new SharedReads<string>();
    const [gate, open] = latch();
    const failing = reads.read("k", async () => {
      await gate;
      throw new Error("connection lost");
    });
    const joined = reads.read("k", async () => "never started");
    open();
    await expect(failing.result).rejects.toThrow("connection lost");
    await expect(joined.result).rejects.toThrow("connection lost");
    const next = reads.read("k", async () => "row");
    expect(next.joined).toBe(false);
    expect(await next.result).toBe("row");
  });
});
