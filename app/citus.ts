/**
 * The service's tables on Citus (made by `prepareSchema`, the owner's job; nothing on plain
 * PostgreSQL). A request of one account touches that account's rows only, so the business tables are
 * distributed by `account_id` and colocated with idem's keys (distributed by `scope`, which is the
 * account here): a payment, its key row and its outbox-free work stay one single-shard transaction on
 * one worker. A distributed table's unique constraints must include the distribution column, so the
 * tables whose primary key was `id` alone get `(account_id, id)` (ids are per account anyway).
 * Accounts and API keys are read by every request and rarely written: reference tables. The receipt
 * worker's `sent_emails` goes with idem's inbox (by `message_id`), written in the same transaction.
 */
import { type Db, isCitus } from "idem/postgres";

type Placement =
  | { table: string; reference: true }
  | { table: string; by: string; colocateWith: string; primaryKey?: string };

const PLACEMENT: Placement[] = [
  { table: "app_schema", reference: true },
  { table: "accounts", reference: true },
  { table: "api_keys", reference: true },
  { table: "payments", by: "account_id", colocateWith: "idem.keys", primaryKey: "account_id, id" },
  { table: "orders", by: "account_id", colocateWith: "idem.keys", primaryKey: "account_id, id" },
  { table: "refunds", by: "account_id", colocateWith: "idem.keys", primaryKey: "account_id, id" },
  { table: "wallet_topups", by: "account_id", colocateWith: "idem.keys" },
  { table: "products", by: "account_id", colocateWith: "idem.keys" },
  { table: "cart_items", by: "account_id", colocateWith: "idem.keys" },
  { table: "sent_emails", by: "message_id", colocateWith: "idem.inbox" },
  { table: "stock", reference: true },
  { table: "checkouts", by: "account_id", colocateWith: "idem.keys", primaryKey: "account_id, id" },
  { table: "checkout_steps", by: "checkout_id", colocateWith: "none" },
];

/** On Citus, distribute the service's tables (idempotent); returns those placed by this call. */
export async function placeAppOnCitus(db: Db): Promise<string[]> {
  if (!(await isCitus(db))) return [];
  const { rows } = await db.query<{ name: string }>(
    `SELECT c.relname AS name FROM pg_dist_partition p
       JOIN pg_class c ON c.oid = p.logicalrelid JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = current_schema()`,
  );
  const placed = new Set(rows.map((r) => r.name));
  const done: string[] = [];
  for (const p of PLACEMENT) {
    if (placed.has(p.table)) continue;
    if ("reference" in p) {
      await db.query("SELECT create_reference_table($1)", [p.table]);
    } else {
      if (p.primaryKey) {
        await db.exec(`ALTER TABLE ${p.table} DROP CONSTRAINT IF EXISTS ${p.table}_pkey`);
        await db.exec(`ALTER TABLE ${p.table} ADD PRIMARY KEY (${p.primaryKey})`);
      }
      await db.query("SELECT create_distributed_table($1, $2, colocate_with => $3)", [
        p.table,
        p.by,
        p.colocateWith,
      ]);
    }
    done.push(p.table);
  }
  return done;
}
