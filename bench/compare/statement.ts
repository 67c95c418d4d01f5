/**
 * idem's single-statement mode on node:http (issue 30, "beyond the hand-written floor"): the same
 * one-INSERT payment, but the key's claim, the INSERT and the saved reply are one autocommitted
 * statement (`SingleStatementStore` + `statement()`), the hand-cte shape with idem's guarantees
 * (fingerprint, retention by partitions, bounded waits, the boundary marker, byte-for-byte replay).
 */
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { idempotency } from "idem/node";
import { fromPg, PostgresStore, SingleStatementStore, statement } from "idem/postgres";
import { pool } from "./frameworks.ts";
import { CRASH_HEADER, CREATED, type Payment } from "./handler.ts";
import { SCOPE } from "./variants.ts";

const PAY = `INSERT INTO payments (idem_key, amount_cents, currency)
  SELECT key, $1, $2 FROM idem_claim RETURNING id, amount_cents, currency`;
const BODY = "json_build_object('id', id::text, 'amount_cents', amount_cents, 'currency', currency)::text";
const HEADERS = { "content-type": "application/json" };

export async function startStatement(url: string): Promise<number> {
  const inner = new SingleStatementStore(await PostgresStore.open(fromPg(pool(url, true))));
  // The crash check (CRASH_HEADER): die right after the statement committed, before any answer.
  const crashing = new Set<string>();
  const store: SingleStatementStore = Object.create(inner, {
    atomic: {
      value: async (...args: Parameters<SingleStatementStore["atomic"]>) => {
        const out = await inner.atomic(...args);
        if (crashing.has(args[0].key)) process.kill(process.pid, "SIGKILL");
        return out;
      },
    },
  });
  const server = createServer(
    idempotency(
      async (req, { tx, key, body }) => {
        const p = body as Payment;
        if (req.headers[CRASH_HEADER] !== undefined) crashing.add(key);
        return statement(tx, {
          sql: PAY,
          params: [p.amount_cents, p.currency],
          body: BODY,
          status: CREATED,
          headers: HEADERS,
        });
      },
      { store, scope: () => SCOPE },
    ),
  );
  return new Promise((resolve) => {
    server.listen(0, "127.0.0.1", () => resolve((server.address() as AddressInfo).port));
  });
}
