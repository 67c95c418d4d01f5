// idem/express: an Express 5 route, its body checked before the key is claimed and typed after.
// Run it: DATABASE_URL=postgres://... npx tsx --conditions=source examples/express.ts
import { createServer } from "node:http";
import express, { type NextFunction, type Request, type Response } from "express";
import { idempotency } from "idem/express";
import { fromPg, migrate, PostgresStore } from "idem/postgres";
import pg from "pg";
import { DATABASE_URL, PAYMENTS_TABLE, paymentOf, serveAndTryTwice } from "./try-twice.ts";

const db = fromPg(new pg.Pool({ connectionString: DATABASE_URL }));
await migrate(db);
await db.exec(PAYMENTS_TABLE);
const store = await PostgresStore.open(db);

// #region snippet
type Payment = { amount_cents: number };

// Before idempotency: a bad body is answered 400 and claims no key.
function checkPayment(req: Request, res: Response, next: NextFunction): void {
  const payment = paymentOf(req.body);
  if (!payment) {
    res.status(400).json({ error: "amount_cents must be a whole number above 0" });
    return;
  }
  req.body = payment;
  next();
}

const app = express();
app.post(
  "/payments",
  express.json(),
  checkPayment,
  idempotency({ store, scope: (req) => req.header("x-account") }),
  async (req: Request<object, unknown, Payment>, res) => {
    const { amount_cents } = req.idempotency.body; // a Payment: the value that was fingerprinted
    const { rows } = await req.idempotency.tx.query(
      "INSERT INTO payments (account, amount_cents) VALUES ($1, $2) RETURNING id, amount_cents",
      [req.idempotency.scope, amount_cents],
    );
    res.status(201).json(rows[0]); // sent once the key's transaction committed
  },
);
// #endregion snippet

serveAndTryTwice(createServer(app), "/payments", db);
