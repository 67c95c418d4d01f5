/**
 * Payments, first cut (atomic mode): the payment row and the saved response commit together.
 */
import { randomBytes } from "node:crypto";
import type { MiddlewareHandler } from "hono";
import { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import { type AtomicStore, bodyKind } from "idem";
import { idempotency } from "idem/hono";
import type { Db, Tx } from "idem/postgres";
import type { Logger } from "pino";
import type { ApiKeys } from "./accounts.ts";
import { problem } from "./problems.ts";

export interface PaymentInput {
  amount_cents: number;
  currency: string;
}

type Env = { Variables: { accountId: string; payment: PaymentInput } };

export const MAX_BODY_BYTES = 16 * 1024;
export const MAX_AMOUNT_CENTS = 100_000_000;

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

/** `Authorization: Bearer <api key>` -> `c.var.accountId`, or 401. */
export function authenticate(apiKeys: ApiKeys): MiddlewareHandler<Env> {
  return async function authenticateMiddleware(c, next) {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(c.req.header("authorization") ?? "");
    const account = m ? await apiKeys.accountFor(m[1]!) : undefined;
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

/** Parse and check the body before the key is claimed: a bad request is answered 400 and saves nothing. */
export function parsePayment(contentType: string | undefined, raw: string): PaymentInput | string {
  let fields: Record<string, unknown>;
  const kind = bodyKind(contentType);
  if (kind === "json") {
    try {
      fields = JSON.parse(raw);
    } catch {
      return "the body is not valid JSON";
    }
    if (fields === null || typeof fields !== "object" || Array.isArray(fields))
      return "the body must be a JSON object";
  } else if (kind === "form") {
    const f = Object.fromEntries(new URLSearchParams(raw));
    fields = { ...f };
    if (typeof f.amount_cents === "string" && /^\d{1,15}$/.test(f.amount_cents)) {
      fields.amount_cents = Number(f.amount_cents);
    }
  } else {
    return "send the body as application/json or application/x-www-form-urlencoded";
  }
  const amount = fields.amount_cents;
  if (typeof amount !== "number" || !Number.isInteger(amount) || amount <= 0 || amount > MAX_AMOUNT_CENTS) {
    return `amount_cents must be a whole number from 1 to ${MAX_AMOUNT_CENTS}`;
  }
  const currency = fields.currency;
  if (typeof currency !== "string" || !/^[a-z]{3}$/.test(currency)) {
    return 'currency must be a three-letter lower-case ISO 4217 code such as "eur"';
  }
  return { amount_cents: amount, currency };
}

const validatePayment: MiddlewareHandler<Env> = async function validatePayment(c, next) {
  const ct = c.req.header("content-type");
  const kind = bodyKind(ct);
  if (kind === "raw") {
    return problem(
      415,
      "unsupported-media-type",
      "Send the body as application/json or application/x-www-form-urlencoded.",
    );
  }
  const parsed = parsePayment(ct, await c.req.text());
  if (typeof parsed === "string") return problem(400, "invalid-body", `Invalid payment: ${parsed}.`);
  c.set("payment", parsed);
  await next();
};

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
    validatePayment,
    idempotency<Env>({ store: deps.store, scope: (c) => c.var.accountId, required: deps.requireKey ?? true }),
    async (c) => {
      const payment = await insertPayment(c.var.idempotency.tx, c.var.accountId, c.var.payment);
      return c.json(payment, 201, { location: `/v1/payments/${payment.id}` });
    },
  );

  app.route("/", paymentReadRoutes(deps));
  return app;
}

/** `GET /v1/payments` (the caller's, newest first) and `GET /v1/payments/:id`: the same in both modes. */
export function paymentReadRoutes(deps: { db: Db; apiKeys: ApiKeys }): Hono<Env> {
  const app = new Hono<Env>();
  app.get("/v1/payments", authenticate(deps.apiKeys), async (c) => {
    const { rows } = await deps.db.query(
      `SELECT id, amount_cents, currency, status, created_at FROM payments
        WHERE account_id = $1 ORDER BY created_at DESC, id DESC LIMIT 100`,
      [c.var.accountId],
    );
    return c.json({ data: rows.map(toPayment) });
  });

  app.get("/v1/payments/:id", authenticate(deps.apiKeys), async (c) => {
    const { rows } = await deps.db.query(
      "SELECT id, amount_cents, currency, status, created_at FROM payments WHERE id = $1 AND account_id = $2",
      [c.req.param("id"), c.var.accountId],
    );
    if (!rows[0]) return problem(404, "not-found", "No payment with this id in your account.");
    return c.json(toPayment(rows[0]));
  });

  return app;
}
