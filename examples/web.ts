// idem/web: a Fetch API handler (Next.js route handler, Bun.serve, Deno.serve), here served by Node.
// Run it: DATABASE_URL=postgres://... npx tsx --conditions=source examples/web.ts
import { serve } from "@hono/node-server";
import { fromPg, migrate, PostgresStore } from "idem/postgres";
import { idempotency } from "idem/web";
import pg from "pg";
import { DATABASE_URL, PAYMENTS_TABLE, tryTwice } from "./try-twice.ts";

const db = fromPg(new pg.Pool({ connectionString: DATABASE_URL }));
await migrate(db);
await db.exec(PAYMENTS_TABLE);
const store = await PostgresStore.open(db);

// #region snippet
// app/api/payments/route.ts (Next.js), or Bun.serve({ fetch: POST }), or Deno.serve(POST)
export const POST = idempotency<unknown, { amount_cents: number }>(
  async (_request, { tx, scope, body }) => {
    const { amount_cents } = body; // the body's type, given above
    const { rows } = await tx.query(
      "INSERT INTO payments (account, amount_cents) VALUES ($1, $2) RETURNING id, amount_cents",
      [scope, amount_cents],
    );
    return Response.json(rows[0], { status: 201 }); // committed with the key, replayed byte for byte
  },
  { store, scope: (request) => request.headers.get("x-account") ?? undefined },
);
// #endregion snippet

const server = serve({ fetch: (request) => POST(request, {}), port: 0 }, async ({ port }) => {
  await tryTwice(`http://127.0.0.1:${port}/api/payments`, async () => {
    const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM payments");
    return rows[0]?.n ?? 0;
  });
  server.close();
  await db.close();
});
