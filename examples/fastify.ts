// idem/fastify: a Fastify 5 route, its body checked by the route's schema (before the key is claimed)
// and typed by its Body generic.
// Run it: DATABASE_URL=postgres://... npx tsx --conditions=source examples/fastify.ts
import Fastify, { type FastifyRequest } from "fastify";
import { idempotency } from "idem/fastify";
import { fromPg, migrate, PostgresStore } from "idem/postgres";
import pg from "pg";
import { DATABASE_URL, PAYMENTS_TABLE, tryTwice } from "./try-twice.ts";

const db = fromPg(new pg.Pool({ connectionString: DATABASE_URL }));
await migrate(db);
await db.exec(PAYMENTS_TABLE);
const store = await PostgresStore.open(db);

// #region snippet
type Payment = { amount_cents: number };
const accountOf = (request: FastifyRequest) => {
  const account = request.headers["x-account"];
  return typeof account === "string" ? account : undefined;
};

const app = Fastify();
app.post<{ Body: Payment }>(
  "/payments",
  {
    // Fastify validates the body before idem's hooks run: a bad body is a 400 that claims no key.
    schema: {
      body: {
        type: "object",
        required: ["amount_cents"],
        properties: { amount_cents: { type: "integer", minimum: 1 } },
      },
    },
    ...idempotency({ store, scope: accountOf }),
  },
  async (request, reply) => {
    const { amount_cents } = request.body; // a Payment, the route's Body
    const { rows } = await request.idempotency.tx.query(
      "INSERT INTO payments (account, amount_cents) VALUES ($1, $2) RETURNING id, amount_cents",
      [request.idempotency.scope, amount_cents],
    );
    return reply.code(201).send(rows[0]); // sent once the key's transaction committed
  },
);
// #endregion snippet

const url = await app.listen({ port: 0, host: "127.0.0.1" });
await tryTwice(`${url}/payments`, async () => {
  const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM payments");
  return rows[0]?.n ?? 0;
});
await app.close();
await db.close();
