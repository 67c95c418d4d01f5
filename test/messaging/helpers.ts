/** Shared pieces of the messaging tests: broker URLs, a migrated database, a wallet to credit. */
import { randomBytes } from "node:crypto";
import type { Db, Tx } from "../../src/postgres/db.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";

export const AMQP_URL = process.env.AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672";
export const NATS_URL = process.env.NATS_URL ?? "nats://127.0.0.1:4222";

/** A name no other test run uses (queues, streams, consumers). */
export function unique(prefix: string): string {
  return `${prefix}_${randomBytes(5).toString("hex")}`;
}

/** idem's schema plus a `wallets` table whose balance messages credit, and an effects log. */
export async function prepare(db: Db): Promise<void> {
  await migrate(db);
  await db.exec(`
    CREATE TABLE wallets (id text PRIMARY KEY, balance_cents bigint NOT NULL DEFAULT 0);
    CREATE TABLE effects (message_id text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
    INSERT INTO wallets (id) VALUES ('w1');
  `);
}

/** The effect of a "credit" message: add to the wallet and log it (so double applications show). */
export async function credit(tx: Tx, message: { id: string; body: string }): Promise<void> {
  const { cents, wallet } = JSON.parse(message.body) as { cents: number; wallet?: string };
  await tx.query("UPDATE wallets SET balance_cents = balance_cents + $1 WHERE id = $2", [
    cents,
    wallet ?? "w1",
  ]);
  await tx.query("INSERT INTO effects (message_id) VALUES ($1)", [message.id]);
}

/**
 * The effect of a message in the throughput tests: one row of its own in `effects`. (Crediting one
 * wallet serialises every transaction on that row's lock, which measures the test, not the inbox.)
 */
export async function record(tx: Tx, message: { id: string }): Promise<void> {
  await tx.query("INSERT INTO effects (message_id) VALUES ($1)", [message.id]);
}

/** Write `n` credit events of 1 cent each into the outbox, `perTx` per transaction. Returns their ids. */
export async function writeCredits(db: Db, n: number, topic: string, perTx = 500): Promise<string[]> {
  const ids: string[] = [];
  for (let done = 0; done < n; done += perTx) {
    await db.transaction(async (tx) => {
      for (let i = done; i < Math.min(n, done + perTx); i++) {
        ids.push(await writeOutbox(tx, { topic, type: "wallet.credited", payload: { cents: 1 } }));
      }
    });
  }
  return ids;
}

/** How often each message id's effect was applied: the counts users care about. */
export async function effectCounts(db: Db): Promise<{ distinct: number; total: number; repeated: number }> {
  const { rows } = await db.query<{ distinct: string; total: string; repeated: string }>(
    `SELECT count(DISTINCT message_id) AS distinct, count(*) AS total,
            (SELECT count(*) FROM (SELECT 1 FROM effects GROUP BY message_id HAVING count(*) > 1) r) AS repeated
     FROM effects`,
  );
  const r = rows[0]!;
  return { distinct: Number(r.distinct), total: Number(r.total), repeated: Number(r.repeated) };
}

export async function balance(db: Db, wallet = "w1"): Promise<number> {
  const { rows } = await db.query<{ b: string }>("SELECT balance_cents AS b FROM wallets WHERE id = $1", [
    wallet,
  ]);
  return Number(rows[0]!.b);
}

/** Poll `check` until it returns true or `ms` pass (then throw with `what`). */
export async function until(
  check: () => Promise<boolean> | boolean,
  ms: number,
  what: string,
): Promise<void> {
  const end = Date.now() + ms;
  for (;;) {
    if (await check()) return;
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}
