/**
 * Knex (`idem/knex`): idem joins Knex's transaction (the `pg` client).
 *
 *   const knex = Knex({ client: "pg", connection: url });
 *   const idemDb = fromKnex(knex);
 *   const store = await PostgresStore.open(idemDb);
 *   app.post("/charges", idempotency({ store, scope }), async (c) => {
 *     const trx = idemDb.tx(c.var.idempotency.tx);    // a Knex.Transaction
 *     const [charge] = await trx("charges").insert({ ... }).returning("*");
 *     return c.json(charge, 201);                      // the insert, the key and this reply commit together
 *   });
 *
 * The store's statements run as `trx.raw(sql, bindings)`, Knex's entry point for SQL it did not build.
 */
import type { Knex } from "knex";
import { type OrmDb, ormDb, resultOf } from "./shared.ts";

export type { OrmDb } from "./shared.ts";

/**
 * `$1..$n` placeholders as Knex's positional `?` (a parameter used twice is bound twice), with any
 * literal `?` (a jsonb operator) escaped so that Knex leaves it alone.
 */
export function knexRaw(sql: string, params: readonly unknown[]): [string, unknown[]] {
  const bindings: unknown[] = [];
  const text = sql.replace(/\?|\$(\d+)/g, (_m, n: string | undefined) => {
    if (n === undefined) return "\\?";
    bindings.push(params[Number(n) - 1] ?? null); // Knex refuses undefined bindings
    return "?";
  });
  return [text, bindings];
}

/** A `Db` for idem's store on a Knex instance (`client: "pg"`). `close()` destroys it when `owned` (default). */
export function fromKnex(knex: Knex, options: { owned?: boolean } = {}): OrmDb<Knex.Transaction> {
  return ormDb<Knex, Knex.Transaction>({
    name: "knex",
    root: knex,
    async query(on, sql, params) {
      const [text, bindings] = knexRaw(sql, params);
      return resultOf(await on.raw(text, bindings as Knex.RawBinding[]));
    },
    transaction: (fn) => knex.transaction(fn),
    async close() {
      if (options.owned ?? true) await knex.destroy();
    },
  });
}
