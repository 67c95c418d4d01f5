/** `idem/kysely`: Kysely's transaction carries the claim, the ORM write and the saved reply. */
import { Kysely, PostgresDialect } from "kysely";
import pg from "pg";
import { describe } from "vitest";
import { fromKysely } from "../../src/orm/kysely.ts";
import { sayWhySkippedWithoutServer } from "../helpers/db.ts";
import { hasServer, ormContract } from "./harness.ts";

sayWhySkippedWithoutServer();

interface Database {
  payments: {
    id: import("kysely").Generated<number>;
    account: string;
    amount_cents: number;
    currency: string;
  };
}

describe.skipIf(!hasServer)("Kysely on node-postgres", () => {
  ormContract(async (url) => {
    const pool = new pg.Pool({ connectionString: url, max: 10 });
    pool.on("error", () => {}); // the test database's DROP ... FORCE cuts idle connections at the end
    const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool }) });
    const idemDb = fromKysely(db);
    return {
      db: idemDb,
      async insert(tx, p) {
        const row = await idemDb
          .tx(tx)
          .insertInto("payments")
          .values({ account: p.account, amount_cents: p.amountCents, currency: p.currency })
          .returning("id")
          .executeTakeFirstOrThrow();
        return row.id;
      },
    };
  });
});
