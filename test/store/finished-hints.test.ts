import { describe, expect, it } from "vitest";
import { FinishedHints } from "../../src/postgres/keys/finished-hints.ts";

describe("FinishedHints", () => {
  it("remembers keys until twice its half is reached, dropping the oldest generation whole", () => {
    const hints = new FinishedHints(4);
    for (const [i, id] of ["a", "b", "c", "d", "e"].entries()) hints.remember(id, 1_000 + i);
    // a, b filled the first generation; c, d the second (a, b dropped with it); e starts the third.
    expect(["a", "b", "c", "d", "e"].map((id) => hints.get(id))).toEqual([
      undefined,
      undefined,
      1_002,
      1_003,
      1_004,
    ]);
  });

  it("keeps a key remembered again in the newer generation, and forgets on request", () => {
    const hints = new FinishedHints(4);
    hints.remember("a", 1);
    hints.remember("b", 2); // a, b now the older generation
    hints.remember("a", 3); // moved to the newer one
    hints.remember("c", 4); // the newer (a, c) becomes the older: b is dropped
    expect([hints.get("a"), hints.get("b"), hints.get("c")]).toEqual([3, undefined, 4]);
    hints.forget("a");
    expect(hints.get("a")).toBeUndefined();
  });
});
