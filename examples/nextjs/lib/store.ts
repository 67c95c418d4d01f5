// The pool and the store, made once per server process, not per request.
import { fromPg, migrate, PostgresStore } from "idem/postgres";
import pg from "pg";

export const db = fromPg(new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 5 }));

let opened: Promise<PostgresStore> | undefined;

/** The store, opened on first use (migrations are the owner's job in production: `idem migrate`). */
export function store(): Promise<PostgresStore> {
  opened ??= (async () => {
    await migrate(db);
    await db.exec(
      "CREATE TABLE IF NOT EXISTS payments (id serial PRIMARY KEY, account text NOT NULL, amount_cents int NOT NULL)",
    );
    return PostgresStore.open(db);
  })();
  return opened;
}
