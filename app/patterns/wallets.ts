/** Wallet top-ups: the caller picks the top-up's id; `ON CONFLICT DO NOTHING`, and the balance is a sum. */
import { Hono } from "hono";
import { FAILED_NOT_APPLIED } from "idem";
import type { Db } from "idem/postgres";
import { problem } from "../problems.ts";
import { TopUpRequest } from "../schemas.ts";
import { validBody, validIds } from "../validate.ts";
import type { PatternDeps, PatternEnv } from "./shared.ts";

export const WALLET_TABLES = `
  CREATE TABLE IF NOT EXISTS wallet_topups (
    id           text NOT NULL,                  -- chosen by the caller: a retry carries the same id
    account_id   text NOT NULL,
    wallet_id    text NOT NULL,
    amount_cents bigint NOT NULL CHECK (amount_cents > 0),
    created_at   timestamptz NOT NULL DEFAULT now()
  );
  -- Top-up ids are per account: one account can neither see nor take another's. Databases made before
  -- had the id alone as primary key: dropped here (no lock taken, nothing done, once it is gone).
  CREATE UNIQUE INDEX IF NOT EXISTS wallet_topups_account_id ON wallet_topups (account_id, id);
  DO $$ BEGIN
    IF EXISTS (SELECT 1 FROM pg_constraint
                WHERE conrelid = 'wallet_topups'::regclass AND conname = 'wallet_topups_pkey') THEN
      ALTER TABLE wallet_topups DROP CONSTRAINT wallet_topups_pkey;
    END IF;
  END $$;
  CREATE INDEX IF NOT EXISTS wallet_topups_wallet ON wallet_topups (account_id, wallet_id);
`;

export function walletRoutes(deps: PatternDeps): Hono<PatternEnv> {
  const { db, limit, auth } = deps;
  const app = new Hono<PatternEnv>();
  const topUp = validBody(TopUpRequest, { what: "top-up" });
  app.post("/v1/wallets/:wallet/topups", limit, auth, validIds("wallet"), topUp, async (c) => {
    const wallet = c.req.param("wallet");
    const { id, amount_cents: amount } = c.var.body;
    const inserted = await db.query(
      `INSERT INTO wallet_topups (id, account_id, wallet_id, amount_cents) VALUES ($1, $2, $3, $4)
       ON CONFLICT (account_id, id) DO NOTHING RETURNING id`,
      [id, c.var.accountId, wallet, amount],
    );
    if (inserted.rowCount === 0) {
      const { rows } = await db.query<{ wallet_id: string; amount_cents: string }>(
        "SELECT wallet_id, amount_cents FROM wallet_topups WHERE account_id = $1 AND id = $2",
        [c.var.accountId, id],
      );
      const r = rows[0];
      if (!r || r.wallet_id !== wallet || Number(r.amount_cents) !== amount) {
        return problem(
          409,
          "topup-id-taken",
          "This top-up id was already used for another top-up; choose a new id.",
          [],
          FAILED_NOT_APPLIED,
        );
      }
    }
    const balance = await walletBalance(db, c.var.accountId, wallet);
    return c.json(
      {
        id,
        wallet_id: wallet,
        amount_cents: amount,
        applied: inserted.rowCount === 1,
        balance_cents: balance,
      },
      inserted.rowCount === 1 ? 201 : 200,
    );
  });

  app.get("/v1/wallets/:wallet", auth, async (c) => {
    const wallet = c.req.param("wallet");
    return c.json({ id: wallet, balance_cents: await walletBalance(db, c.var.accountId, wallet) });
  });
  return app;
}

async function walletBalance(db: Db, account: string, wallet: string): Promise<number> {
  const { rows } = await db.query<{ total: string }>(
    "SELECT coalesce(sum(amount_cents), 0) AS total FROM wallet_topups WHERE account_id = $1 AND wallet_id = $2",
    [account, wallet],
  );
  return Number(rows[0]!.total);
}
