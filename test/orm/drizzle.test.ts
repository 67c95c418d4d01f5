/** `idem/drizzle`: Drizzle's transaction carries the claim, the ORM write and the saved reply. */
import { drizzle as drizzlePg } from "drizzle-orm/node-postgres";
import { integer, pgTable, serial, text } from "drizzle-orm/pg-core";
import { drizzle as drizzlePostgresJs } from "drizzle-orm/postgres-js";
import pg from "pg";
import postgres from "postgres";
import { describe, expect, it } from "vitest";
import { fromDrizzle } from "../../src/orm/drizzle.ts";
import { sayWhySkippedWithoutServer } from "../helpers/db.ts";
import { hasServer, ormContract } from "./harness.ts";

sayWhySkippedWithoutServer();

const payments = pgTable("payments", {
  id: serial().primaryKey(),
  account: text().notNull(),
  amountCents: integer("amount_cents").notNull(),
  currency: text().notNull(),
});

describe.skipIf(!hasServer)("Drizzle on node-postgres", () => {
  ormContract(async (url) => {
    const pool = new pg.Pool({ connectionString: url, max: 10 });
    // The database is dropped WITH (FORCE) after the file: an idle client still connected then gets
    // 57P01, which without a listener throws out of the test file (test/helpers/db.ts does the same).
    pool.on("error", () => {});
    const idemDb = fromDrizzle(drizzlePg(pool));
    return {
      db: idemDb,
      async insert(tx, p) {
        const [row] = await idemDb.tx(tx).insert(payments).values(p).returning({ id: payments.id });
        return row!.id;
      },
    };
  });
});

describe.skipIf(!hasServer)("Drizzle on postgres.js", () => {
  ormContract(async (url) => {
    const idemDb = fromDrizzle(drizzlePostgresJs(postgres(url, { max: 10, onnotice: () => {} })));
    return {
      db: idemDb,
      async insert(tx, p) {
        const [row] = await idemDb.tx(tx).insert(payments).values(p).returning({ id: payments.id });
        return row!.id;
      },
    };
  });
});

describe("fromDrizzle", () => {
  it("refuses a transaction another Db opened, with the fix in the message", async () => {
    const pool = new pg.Pool({ connectionString: "postgres://127.0.0.1:1/none" });
    const idemDb = fromDrizzle(drizzlePg(pool));
    const tx = { raw: {}, query: async () => ({ rows: [], rowCount: 0 }), exec: async () => {}, final() {} };
    expect(() => idemDb.tx(tx)).toThrow(/not opened by drizzle: open the store on the same Db/);
    await pool.end();
  });
});
