/**
 * Kysely (`idem/kysely`): idem joins Kysely's transaction.
 *
 *   const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool }) });
 *   const idemDb = fromKysely(db);
 *   const store = await PostgresStore.open(idemDb);
 *   app.post("/charges", idempotency({ store, scope }), async (c) => {
 *     const trx = idemDb.tx(c.var.idempotency.tx);    // Transaction<Database>, typed
 *     const charge = await trx.insertInto("charges").values({ ... }).returningAll().executeTakeFirstOrThrow();
 *     return c.json(charge, 201);                      // the insert, the key and this reply commit together
 *   });
 *
 * The store's statements run as `CompiledQuery.raw(sql, params)` on the transaction, Kysely's own entry
 * point for SQL it did not build.
 */
import { CompiledQuery, type Kysely, type Transaction } from "kysely";
import { type OrmDb, ormDb } from "./shared.ts";

export type { OrmDb } from "./shared.ts";

/**
 * A `Db` for idem's store on a Kysely instance (PostgreSQL dialect). `close()` destroys it only when
 * `owned` is true (the default).
 */
export function fromKysely<DB>(db: Kysely<DB>, options: { owned?: boolean } = {}): OrmDb<Transaction<DB>> {
  return ormDb<Kysely<DB>, Transaction<DB>>({
    name: "kysely",
    root: db,
    async query(on, sql, params) {
      const r = await on.executeQuery(CompiledQuery.raw(sql, params));
      // Kysely counts affected rows for INSERT/UPDATE/DELETE/MERGE only; a SELECT's count is its rows.
      return { rows: r.rows as any[], rowCount: Number(r.numAffectedRows ?? r.rows.length) };
    },
    transaction: (fn) => db.transaction().execute(fn),
    async close() {
      if (options.owned ?? true) await db.destroy();
    },
  });
}
