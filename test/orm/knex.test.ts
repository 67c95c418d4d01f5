/** `idem/knex`: Knex's transaction carries the claim, the ORM write and the saved reply. */
import Knex from "knex";
import { describe, expect, it } from "vitest";
import { fromKnex, knexRaw } from "../../src/orm/knex.ts";
import { sayWhySkippedWithoutServer } from "../helpers/db.ts";
import { hasServer, ormContract } from "./harness.ts";

sayWhySkippedWithoutServer();

describe.skipIf(!hasServer)("Knex on pg", () => {
  ormContract(async (url) => {
    const idemDb = fromKnex(Knex({ client: "pg", connection: url, pool: { min: 0, max: 10 } }));
    return {
      db: idemDb,
      async insert(tx, p) {
        const [row] = await idemDb
          .tx(tx)("payments")
          .insert({ account: p.account, amount_cents: p.amountCents, currency: p.currency })
          .returning("id");
        return (row as { id: number }).id;
      },
    };
  });
});

describe("knexRaw", () => {
  it("binds each $n in order (twice when used twice) and escapes a literal ?", () => {
    expect(knexRaw("SELECT $2, $1, $2, data ? 'k'", ["a", "b"])).toEqual([
      "SELECT ?, ?, ?, data \\? 'k'",
      ["b", "a", "b"],
    ]);
  });
});
