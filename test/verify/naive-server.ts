/**
 * A deliberately naive payments server, for showing what `idem verify` catches. It looks idempotent
 * and passes a "send it twice" test, but:
 *
 * - check-then-insert: it SELECTs the key, does the work (with a small delay, as a real call to a
 *   payment provider would take), and only then INSERTs the key. Two copies sent at the same moment
 *   both see "no row" and both charge.
 * - keys are not scoped: the key table has no account column, so a second account that happens to
 *   use the same key gets the first account's payment.
 * - no fingerprint: the same key with another body replays the old answer instead of a 422.
 *
 * Same API as the reference service: POST /v1/payments (Bearer sk_test_demo_1 or _2, Idempotency-Key
 * required, {"amount_cents", "currency"}) -> 201 with the payment; GET /v1/payments lists them.
 *
 * Run it on its own (PORT, default 3999): npx tsx --conditions=source test/verify/naive-server.ts
 */
import { randomBytes } from "node:crypto";
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Db } from "../../src/postgres/db.ts";
import { backends, type TestBackend } from "../helpers/db.ts";

const ACCOUNTS: Record<string, string> = { sk_test_demo_1: "acct_1", sk_test_demo_2: "acct_2" };

export interface NaiveServer {
  url: string;
  count(sql: string, params?: unknown[]): Promise<number>;
  /** Its database (for `sqlEffects`). */
  db: Db;
  stop(): Promise<void>;
}

/**
 * `db`: a database to put its two tables in (`naive_payments`, `naive_keys`; left open on stop), or
 * `backend`: a fresh database from test/helpers/db.ts (default: PGlite in memory).
 */
export async function startNaiveServer(
  options: { workMs?: number; db?: Db; backend?: TestBackend; port?: number } = {},
): Promise<NaiveServer> {
  const workMs = options.workMs ?? 25;
  const open = options.db
    ? { db: options.db, close: async () => {} }
    : await (options.backend ?? backends[0]!).open();
  const db = open.db;
  await db.exec(`
    CREATE TABLE naive_payments (id text PRIMARY KEY, account_id text NOT NULL, amount_cents int NOT NULL,
                           currency text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
    CREATE TABLE naive_keys (key text NOT NULL, status int NOT NULL, body text NOT NULL);
  `);

  const send = (res: ServerResponse, status: number, body: unknown) => {
    const text = typeof body === "string" ? body : JSON.stringify(body);
    res.writeHead(status, { "content-type": "application/json" }).end(text);
  };

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const raw = Buffer.concat(chunks).toString("utf8");
    const token = /^Bearer\s+(\S+)$/i.exec(req.headers.authorization ?? "")?.[1];
    const account = token ? ACCOUNTS[token] : undefined;
    if (!account) return send(res, 401, { error: "unauthorized" });
    const path = new URL(req.url ?? "/", "http://x").pathname;

    if (req.method === "GET" && path === "/v1/payments") {
      const { rows } = await db.query(
        "SELECT id, amount_cents, currency FROM naive_payments WHERE account_id = $1 ORDER BY created_at DESC",
        [account],
      );
      return send(res, 200, { data: rows });
    }
    if (req.method !== "POST" || path !== "/v1/payments") return send(res, 404, { error: "not found" });

    const key = req.headers["idempotency-key"];
    if (typeof key !== "string" || !key) return send(res, 400, { error: "Idempotency-Key required" });
    let input: { amount_cents?: unknown; currency?: unknown };
    try {
      input = JSON.parse(raw);
    } catch {
      return send(res, 400, { error: "invalid JSON" });
    }
    if (typeof input.amount_cents !== "number" || typeof input.currency !== "string") {
      return send(res, 400, { error: "amount_cents and currency required" });
    }

    // The bug: check, then act, then record. Nothing stops a second request between the two.
    const seen = await db.query<{ status: number; body: string }>(
      "SELECT status, body FROM naive_keys WHERE key = $1 LIMIT 1", // no account: not scoped
      [key],
    );
    if (seen.rows[0]) return send(res, seen.rows[0].status, seen.rows[0].body); // no body check
    await new Promise((r) => setTimeout(r, workMs)); // "calling the payment provider"
    const id = `pay_${randomBytes(8).toString("hex")}`;
    await db.query(
      "INSERT INTO naive_payments (id, account_id, amount_cents, currency) VALUES ($1, $2, $3, $4)",
      [id, account, input.amount_cents, input.currency],
    );
    const body = JSON.stringify({ id, amount_cents: input.amount_cents, currency: input.currency });
    await db.query("INSERT INTO naive_keys (key, status, body) VALUES ($1, 201, $2)", [key, body]);
    return send(res, 201, body);
  }

  const server = http.createServer((req, res) => {
    handle(req, res).catch((err) => send(res, 500, { error: String(err) }));
  });
  await new Promise<void>((r) => server.listen(options.port ?? 0, "127.0.0.1", () => r()));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    db,
    async count(sql, params) {
      const { rows } = await db.query<Record<string, unknown>>(sql, params);
      return Number(Object.values(rows[0] ?? {})[0]);
    },
    async stop() {
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
      await open.close();
    },
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const naive = await startNaiveServer({ port: Number(process.env.PORT ?? 3999) });
  console.log(`naive payments server on ${naive.url} (in-memory PGlite); Ctrl-C stops it`);
  process.once("SIGINT", () => naive.stop());
  process.once("SIGTERM", () => naive.stop());
}
