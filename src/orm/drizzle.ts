/**
 * Drizzle (`idem/drizzle`): idem joins Drizzle's transaction, on node-postgres and on postgres.js alike.
 *
 *   const db = drizzle(pool);                         // drizzle-orm/node-postgres or drizzle-orm/postgres-js
 *   const idemDb = fromDrizzle(db);
 *   await migrate(idemDb);
 *   const store = await PostgresStore.open(idemDb);
 *   app.post("/charges", idempotency({ store, scope }), async (c) => {
 *     const trx = idemDb.tx(c.var.idempotency.tx);    // Drizzle's transaction, typed like db
 *     const [charge] = await trx.insert(charges).values({ ... }).returning();
 *     return c.json(charge, 201);                      // the insert, the key and this reply commit together
 *   });
 *
 * The store's statements go through `trx.execute(sql)`; `trx.transaction()` inside the handler is a
 * savepoint, as Drizzle makes it.
 */
import { type SQL, sql } from "drizzle-orm";
import type { PgDatabase } from "drizzle-orm/pg-core";
import { type OrmDb, ormDb, resultOf } from "./shared.ts";

export type { OrmDb } from "./shared.ts";

/** Any Drizzle PostgreSQL database (`drizzle(pool)` with node-postgres, postgres.js or PGlite). */
export type AnyPgDatabase = PgDatabase<any, any, any>;

/** The transaction object `db.transaction()` hands its callback, for this `db`'s type. */
export type DrizzleTransaction<D extends AnyPgDatabase> = Parameters<Parameters<D["transaction"]>[0]>[0];

/** A statement with `$1..$n` parameters as Drizzle SQL (parameters bound, never spliced into the text). */
export function drizzleSql(text: string, params: readonly unknown[]): SQL {
  const chunks: SQL[] = [];
  let at = 0;
  for (const m of text.matchAll(/\$(\d+)/g)) {
    chunks.push(sql.raw(text.slice(at, m.index)));
    chunks.push(sql`${sql.param(params[Number(m[1]) - 1])}`);
    at = m.index + m[0].length;
  }
  chunks.push(sql.raw(text.slice(at)));
  return sql.join(chunks);
}

/**
 * A `Db` for idem's store on a Drizzle database (PostgreSQL). `close()` ends Drizzle's client
 * (`db.$client`) only when `owned` is true (the default).
 */
export function fromDrizzle<D extends AnyPgDatabase>(
  db: D,
  options: { owned?: boolean } = {},
): OrmDb<DrizzleTransaction<D>> {
  return ormDb<AnyPgDatabase, DrizzleTransaction<D>>({
    name: "drizzle",
    root: db,
    query: async (on, text, params) => resultOf(await on.execute(drizzleSql(text, params))),
    transaction: (fn) => db.transaction((trx) => fn(trx as DrizzleTransaction<D>)),
    async close() {
      const client = (db as { $client?: { end?(): Promise<void> } }).$client;
      if (options.owned ?? true) await client?.end?.();
    },
  });
}
