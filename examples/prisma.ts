// idem/prisma: Hono + Prisma 7 (the prisma-client generator with @prisma/adapter-pg).
// Run it: generate the client (see examples/prisma/schema.prisma), then
//   DATABASE_URL=postgres://... npx tsx --conditions=source examples/prisma.ts
import { serve } from "@hono/node-server";
import { PrismaPg } from "@prisma/adapter-pg";
import { Hono } from "hono";
import { validator } from "hono/validator";
import { idempotency } from "idem/hono";
import { migrate, PostgresStore } from "idem/postgres";
import { fromPrisma } from "idem/prisma";
import { DATABASE_URL, PAYMENTS_TABLE, paymentOf, tryTwice } from "./try-twice.ts";

// In your app: import { PrismaClient } from "./generated/prisma/client.ts" (here generated out of the tree).
// (A path in a variable: tsc does not look for the client before it is generated.)
const generated = "../.idem/prisma-example/client.ts";
const { PrismaClient } = await import(generated);
const app = new Hono();

// #region snippet
const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: DATABASE_URL }) });
const idemDb = fromPrisma(prisma); // idem runs inside Prisma's interactive transactions
await migrate(idemDb);
const store = await PostgresStore.open(idemDb);

app.post(
  "/payments",
  validator("json", (body, c) => paymentOf(body) ?? c.text("amount_cents: a whole number", 400)),
  idempotency({ store, scope: (c) => c.req.header("x-account") }),
  async (c) => {
    const tx = idemDb.tx(c.var.idempotency.tx); // Prisma's transaction client
    const { amount_cents } = c.req.valid("json"); // typed by the validator, from the bytes idem read
    const payment = await tx.payment.create({
      data: { account: c.var.idempotency.scope, amountCents: amount_cents },
    });
    return c.json(payment, 201); // the create, the key and this reply commit together
  },
);
// #endregion snippet

await idemDb.exec(PAYMENTS_TABLE);
const server = serve({ fetch: app.fetch, port: 0 }, async ({ port }) => {
  await tryTwice(`http://127.0.0.1:${port}/payments`, () => prisma.payment.count());
  server.close();
  await idemDb.close();
});
