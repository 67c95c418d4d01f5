import type { Db } from "../db.ts";

/**
 * idem on Citus (distributed PostgreSQL for multi-tenant OLTP). `migrate` finds the `citus` extension
 * in the database and places idem's tables, with no setting:
 *
 *   keys            distributed by `scope` (the tenant: the primary key starts with it); the partitions
 *                   made later (`idem sweep`) are distributed with it. A key's rows live on one worker,
 *                   the same one as the tenant's business rows when those are distributed by the same
 *                   value and colocated (`colocate_with => 'idem.keys'`).
 *   key_events      a key's history (phases mode), distributed by `scope` and colocated with keys: the
 *                   statement that changes a key row appends its event on the same shard.
 *   key_locks       made here (empty, Citus only), distributed by `scope` and colocated with keys: the
 *                   per-key lock is taken on the key's shard through it (`shardLockSql`), so instances
 *                   connected to different Citus nodes serialise on the same key.
 *   inbox, inbox_attempts, inbox_parked
 *                   distributed by `message_id` (one message's rows on one shard; inbox partitions
 *                   follow).
 *   settings, migrations, sealing_key, sealing_readers, reviews, outbox, admin_actions,
 *   reconcile_findings
 *                   reference tables (a copy on every node): small or rarely written, read from any
 *                   node; the outbox because the relay claims across all events in id order
 *                   (`FOR UPDATE SKIP LOCKED`), which a reference table allows on any node (its
 *                   NOTIFY trigger is dropped: the relay polls).
 *
 * Idempotent: a table already placed is left as it is. Runs once per `migrate` that applied a
 * migration or finds a table not placed (a catalog read otherwise), as the schema's owner.
 */

/** Whether the database has the `citus` extension. */
export async function isCitus(db: Pick<Db, "query">): Promise<boolean> {
  const { rows } = await db.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM pg_extension WHERE extname = 'citus'",
  );
  return Number(rows[0]?.n) > 0;
}

type Placement = { table: string; how: "reference" } | { table: string; how: "distributed"; column: string };

/** Where each of idem's tables goes on Citus (in this order: keys first, the others colocate with it). */
export const CITUS_PLACEMENT: Placement[] = [
  { table: "keys", how: "distributed", column: "scope" },
  { table: "key_locks", how: "distributed", column: "scope" },
  { table: "key_events", how: "distributed", column: "scope" },
  { table: "inbox", how: "distributed", column: "message_id" },
  { table: "inbox_attempts", how: "distributed", column: "message_id" },
  { table: "inbox_parked", how: "distributed", column: "message_id" },
  { table: "settings", how: "reference" },
  { table: "migrations", how: "reference" },
  { table: "sealing_key", how: "reference" },
  { table: "sealing_readers", how: "reference" },
  { table: "reviews", how: "reference" },
  { table: "outbox", how: "reference" },
  { table: "admin_actions", how: "reference" },
  { table: "reconcile_findings", how: "reference" },
];

/**
 * On Citus, distribute idem's tables (`CITUS_PLACEMENT`); elsewhere nothing. Returns the tables placed
 * by this call. Each step is its own statement (Citus refuses to distribute a table in a transaction
 * block that wrote to it).
 */
export async function placeOnCitus(db: Db, schema: string): Promise<string[]> {
  if (!(await isCitus(db))) return [];
  await db.exec(`CREATE TABLE IF NOT EXISTS ${schema}.key_locks (scope text PRIMARY KEY)`);
  const { rows } = await db.query<{ name: string }>(
    `SELECT c.relname AS name FROM pg_dist_partition p
       JOIN pg_class c ON c.oid = p.logicalrelid JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = $1`,
    [schema],
  );
  const placed = new Set(rows.map((r) => r.name));
  const done: string[] = [];
  for (const p of CITUS_PLACEMENT) {
    if (placed.has(p.table)) continue;
    const exists = await db.query<{ t: string | null }>("SELECT to_regclass($1)::text AS t", [
      `${schema}.${p.table}`,
    ]);
    if (!exists.rows[0]?.t) continue; // an older schema without it
    if (p.table === "outbox") {
      // Citus distributes no table with triggers, and a NOTIFY in a transaction that writes on more
      // than one node fails its PREPARE (two-phase commit): the NOTIFY trigger goes. A relay on Citus
      // finds new events by polling (`pollMs`, 5 s when it has LISTEN, 500 ms without).
      await db.exec(`DROP TRIGGER IF EXISTS outbox_notify ON ${schema}.outbox`);
      await db.query("SELECT create_reference_table($1)", [`${schema}.outbox`]);
    } else if (p.how === "reference") {
      await db.query("SELECT create_reference_table($1)", [`${schema}.${p.table}`]);
    } else {
      const colocate = p.column === "scope" && p.table !== "keys" ? `${schema}.keys` : "default";
      await db.query("SELECT create_distributed_table($1, $2, colocate_with => $3)", [
        `${schema}.${p.table}`,
        p.column,
        colocate,
      ]);
    }
    done.push(p.table);
  }
  return done;
}

/** Whether `schema` was placed on Citus by `migrate` (its `key_locks` table exists). */
export async function placedOnCitus(db: Pick<Db, "query">, schema: string): Promise<boolean> {
  const { rows } = await db.query<{ t: string | null }>("SELECT to_regclass($1)::text AS t", [
    `${schema}.key_locks`,
  ]);
  return Boolean(rows[0]?.t);
}

/**
 * The per-key lock on Citus: the same transaction-scoped advisory lock, taken on the node that holds
 * the key's shard. A SELECT routed to one shard of `key_locks` (by `scope`) runs whole on that shard's
 * node, in the distributed transaction's connection there (the one its later statements on that shard
 * use), so the lock lasts until the transaction ends and every instance, whichever node it is
 * connected to, meets it on that node. An aggregate without GROUP BY gives one row, so the lock is
 * taken on the empty table. The wait is bounded on that node: `lock_timeout` is set (transaction-local)
 * in the same row just before the lock and put back just after, since a `SET LOCAL` sent to the
 * connected node does not reach the shard's node (and propagating it makes Citus refuse the query).
 */
export function shardLockSql(schema: string, scope: string, lockId: string, waitMs: number): string {
  return (
    "SELECT set_config('lock_timeout', w.prev, true) AS lock_timeout FROM (" +
    `SELECT current_setting('lock_timeout') AS prev, set_config('lock_timeout', '${waitMs}ms', true) AS wait, ` +
    `pg_advisory_xact_lock(${lockId}) AS locked, count(*) AS n FROM ${schema}.key_locks WHERE scope = ${literal(scope)}) w`
  );
}

/** A SQL string literal (standard_conforming_strings, on since PostgreSQL 9.1). */
function literal(s: string): string {
  if (s.includes("\0")) throw new Error("a scope may not contain a NUL character");
  return `'${s.replaceAll("'", "''")}'`;
}

/** How long the plain DETACH on Citus waits for the keys table's lock before trying again. */
const DETACH_LOCK_WAIT_MS = 2_000;

/**
 * Detach a partition of a distributed table. Citus refuses DETACH PARTITION CONCURRENTLY (0A000), so
 * the plain DETACH: it takes an ACCESS EXCLUSIVE lock on the partitioned table (on the coordinator
 * and on every shard), so it is bounded by `lock_timeout` (the requests queued behind it wait at most
 * that long) and retried a few times; the detached table is then dropped as on plain PostgreSQL.
 */
export async function detachOnCitus(db: Db, parent: string, partition: string): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await db.transaction(async (tx) => {
        await tx.exec(`SET LOCAL lock_timeout = '${DETACH_LOCK_WAIT_MS}ms'`);
        await tx.exec(`ALTER TABLE ${parent} DETACH PARTITION ${partition}`);
      });
      return;
    } catch (err) {
      if ((err as { code?: string }).code !== "55P03" || attempt >= 5) throw err;
      await new Promise((r) => setTimeout(r, 200 * attempt));
    }
  }
}

/** The error Citus gives for DETACH PARTITION ... CONCURRENTLY. */
export function isUnsupportedOnCitus(err: unknown): boolean {
  return /DETACH PARTITION .* CONCURRENTLY commands are currently unsupported/.test(
    String((err as Error).message),
  );
}
