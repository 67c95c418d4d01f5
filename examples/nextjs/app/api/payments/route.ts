// A Next.js App Router route handler made idempotent by idem/web (docs/serverless.md).
// POST /api/payments with an Idempotency-Key: the first call inserts the payment and saves the answer in
// the same transaction; a retry with the key gets the same answer, byte for byte, and inserts nothing.
import { idempotency, type WebHandler } from "idem/web";
import { db, store } from "../../../lib/store.ts";

export const runtime = "nodejs"; // pg needs Node's sockets (the Edge runtime has none)

// Made on the first request, not at import: `next build` imports this module without a database.
let pay: Promise<WebHandler> | undefined;

export async function POST(request: Request): Promise<Response> {
  pay ??= store().then((s) =>
    idempotency<unknown, { amount_cents: number }>(
      async (_request, { tx, scope, body }) => {
        const { rows } = await tx.query(
          "INSERT INTO payments (account, amount_cents) VALUES ($1, $2) RETURNING id, amount_cents",
          [scope, body.amount_cents],
        );
        return Response.json(rows[0], { status: 201 });
      },
      // The scope comes from authentication in a real app (a session, a verified token), never the body.
      { store: s, scope: (request) => request.headers.get("x-account") ?? undefined },
    ),
  );
  return (await pay)(request, {});
}

/** How many payments an account has (for the example's test). */
export async function GET(request: Request): Promise<Response> {
  const account = new URL(request.url).searchParams.get("account");
  const { rows } = await db.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM payments WHERE account = $1",
    [account],
  );
  return Response.json(rows[0]);
}
