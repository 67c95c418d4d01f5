// idem/node: a plain node:http listener; the handler checks the body it is given before any write.
// Run it: DATABASE_URL=postgres://... npx tsx --conditions=source examples/node.ts
import { createServer, type IncomingMessage } from "node:http";
import { idempotency } from "idem/node";
import { fromPg, migrate, PostgresStore } from "idem/postgres";
import pg from "pg";
import { DATABASE_URL, PAYMENTS_TABLE, paymentOf, serveAndTryTwice } from "./try-twice.ts";

const db = fromPg(new pg.Pool({ connectionString: DATABASE_URL }));
await migrate(db);
await db.exec(PAYMENTS_TABLE);
const store = await PostgresStore.open(db);

// #region snippet
const accountOf = (req: IncomingMessage) => {
  const account = req.headers["x-account"];
  return typeof account === "string" ? account : undefined;
};
const json = { "content-type": "application/json" };

const server = createServer(
  idempotency(
    async (_req, { tx, scope, body }) => {
      const payment = paymentOf(body); // the body as read once and fingerprinted
      if (!payment) {
        // Not a final answer: nothing is saved, and a corrected retry under the same key runs.
        return {
          status: 400,
          headers: json,
          body: '{"error":"amount_cents must be a whole number above 0"}',
        };
      }
      const { rows } = await tx.query(
        "INSERT INTO payments (account, amount_cents) VALUES ($1, $2) RETURNING id, amount_cents",
        [scope, payment.amount_cents],
      );
      return { status: 201, headers: json, body: JSON.stringify(rows[0]) }; // committed with the key
    },
    { store, scope: accountOf },
  ),
);
// #endregion snippet

serveAndTryTwice(server, "/payments", db);
