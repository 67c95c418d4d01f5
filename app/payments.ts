/**
 * Payments, first cut (atomic mode): the payment row and the saved response commit together.
 */
import { randomBytes } from "node:crypto";
import type { Context, MiddlewareHandler } from "hono";
import { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import type { AtomicStore } from "idem";
import { idempotency } from "idem/hono";
import type { Db, Tx } from "idem/postgres";
import type { Logger } from "pino";
import type { ApiKeys } from "./accounts.ts";
import { problem } from "./problems.ts";
import { type PaymentInput, PaymentRequest } from "./schemas.ts";
import { validBody } from "./validate.ts";

export type { PaymentInput };

type Env = { Variables: { accountId: string; body: PaymentInput } };

export const MAX_BODY_BYTES = 16 * 1024;

export interface Payment {
  id: string;
  amount_cents: number;
  currency: string;
  status: string;
  created_at: string;
}

export function toPayment(row: Record<string, unknown>): Payment {
  return {
    id: String(row.id),
    amount_cents: Number(row.amount_cents),
    currency: String(row.currency),
    status: String(row.status),
    created_at: new Date(row.created_at as string).toISOString(),
  };
}

/** The API key of `Authorization: Bearer <api key>`, if the request has one. */
export function bearerOf(c: Context): string | undefined {
  return /^Bearer\s+(\S+)\s*$/i.exec(c.req.header("authorization") ?? "")?.[1];
}

/** `Authorization: Bearer <api key>` -> `c.var.accountId`, or 401. */
export function authenticate(apiKeys: ApiKeys): MiddlewareHandler<Env> {
  return async function authenticateMiddleware(c, next) {
    const apiKey = bearerOf(c);
    const account = apiKey ? await apiKeys.accountFor(apiKey) : undefined;
    if (!account) {
      return problem(401, "unauthorized", "Send a valid API key as `Authorization: Bearer <api key>`.", [
        ["www-authenticate", 'Bearer realm="idem"'],
      ]);
    }
    c.set("accountId", account);
    if (c.var.log) c.set("log", c.var.log.child({ scope: account }) as Logger);
    await next();
  };
}

/**
 * The keyed routes' `authorizeReplay`: before a saved answer is replayed (or a phases key resumed), the
 * caller's API key is looked up again in the database, past `authenticate`'s cache, and must still
 * belong to the account the key was claimed for. A key revoked a second ago gets 401, not the answer.
 */
export function replayAuthorized<E extends { Variables: { accountId: string } }>(
  apiKeys: ApiKeys,
): (c: Context<E>) => Promise<boolean> {
  return async function authorizeReplay(c) {
    const apiKey = bearerOf(c);
    return apiKey !== undefined && (await apiKeys.accountForUncached(apiKey)) === c.var.accountId;
  };
}

export async function insertPayment(
  tx: Pick<Db, "query"> | Tx,
  accountId: string,
  p: PaymentInput,
): Promise<Payment> {
  const id = `pay_${randomBytes(12).toString("hex")}`;
  const { rows } = await tx.query(
    `INSERT INTO payments (id, account_id, amount_cents, currency, status)
     VALUES ($1, $2, $3, $4, 'succeeded') RETURNING id, amount_cents, currency, status, created_at`,
    [id, accountId, p.amount_cents, p.currency],
  );
  return toPayment(rows[0]!);
}

export function paymentRoutes(deps: {
  db: Db;
  store: AtomicStore<Tx>;
  apiKeys: ApiKeys;
  /** Require an Idempotency-Key on POST (default true; the benchmark turns it off for its baseline). */
  requireKey?: boolean;
}): Hono<Env> {
  const app = new Hono<Env>();
  const tooLarge = () => problem(413, "body-too-large", `The body is larger than ${MAX_BODY_BYTES} bytes.`);

  app.post(
    "/v1/payments",
    bodyLimit({ maxSize: MAX_BODY_BYTES, onError: tooLarge }),
    authenticate(deps.apiKeys),
    // Checked before the key is claimed: a bad request is answered 400/415 and saves nothing.
    validBody(PaymentRequest, { what: "payment", form: true }),
    idempotency<Env>({
      store: deps.store,
      scope: (c) => c.var.accountId,
      required: deps.requireKey ?? true,
      authorizeReplay: replayAuthorized(deps.apiKeys),
      // The handler's only effect is its INSERT in the key's transaction: sent with the claim.
      effectsInTxOnly: true,
      // A public route: each request's trace is its own, linked to the caller's, never continued.
      traceContext: "link",
    }),
    async (c) => {
      const payment = await insertPayment(c.var.idempotency.tx, c.var.accountId, c.var.body);
      return c.json(payment, 201, { location: `/v1/payments/${payment.id}` });
    },
  );

  app.route("/", paymentReadRoutes(deps));
  return app;
}

/** The account's last 100 payments, newest first (`GET /v1/payments`, the MCP tool `list_payments`). */
export async function listPayments(db: Pick<Db, "query">, accountId: string): Promise<Payment[]> {
  const { rows } = await db.query(
    `SELECT id, amount_cents, currency, status, created_at FROM payments
      WHERE account_id = $1 ORDER BY created_at DESC, id DESC LIMIT 100`,
    [accountId],
  );
  return rows.map(toPayment);
}

/** One payment of the account, or undefined (`GET /v1/payments/:id`, the MCP tool `get_payment`). */
export async function findPayment(
  db: Pick<Db, "query">,
  accountId: string,
  id: string,
): Promise<Payment | undefined> {
  const { rows } = await db.query(
    "SELECT id, amount_cents, currency, status, created_at FROM payments WHERE id = $1 AND account_id = $2",
    [id, accountId],
  );
  return rows[0] ? toPayment(rows[0]) : undefined;
}

/** `GET /v1/payments` (the caller's, newest first) and `GET /v1/payments/:id`: the same in both modes. */
export function paymentReadRoutes(deps: { db: Db; apiKeys: ApiKeys }): Hono<Env> {
  const app = new Hono<Env>();
  app.get("/v1/payments", authenticate(deps.apiKeys), async (c) => {
    return c.json({ data: await listPayments(deps.db, c.var.accountId) });
  });

  app.get("/v1/payments/:id", authenticate(deps.apiKeys), async (c) => {
    const payment = await findPayment(deps.db, c.var.accountId, c.req.param("id"));
    if (!payment) return problem(404, "not-found", "No payment with this id in your account.");
    return c.json(payment);
  });

  return app;
}
