// idem/nestjs: a Nest controller on Express (or Fastify: pass new FastifyAdapter()), writing with Kysely.
// Run it: DATABASE_URL=postgres://... npx tsx --conditions=source examples/nestjs.ts
import "reflect-metadata";
import { Controller, Module, Post } from "@nestjs/common";
import { NestFactory } from "@nestjs/core";
import type { Request } from "express";
import { fromKysely } from "idem/kysely";
import { IdempotencyCtx, IdempotencyModule, Idempotent, type NestIdempotencyContext } from "idem/nestjs";
import { migrate, PostgresStore } from "idem/postgres";
import { type Generated, Kysely, PostgresDialect } from "kysely";
import pg from "pg";
import { DATABASE_URL, PAYMENTS_TABLE, tryTwice } from "./try-twice.ts";

interface Database {
  payments: { id: Generated<number>; account: string; amount_cents: number };
}
const db = new Kysely<Database>({
  dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: DATABASE_URL }) }),
});
const idemDb = fromKysely(db);
await migrate(idemDb);
await idemDb.exec(PAYMENTS_TABLE);
const store = await PostgresStore.open(idemDb);

// #region snippet
@Controller("payments")
class PaymentsController {
  @Post()
  @Idempotent() // the handler runs in the key's transaction; what it returns is saved and replayed
  async create(@IdempotencyCtx() idem: NestIdempotencyContext<{ amount_cents: number }>) {
    const { amount_cents } = idem.body; // your DTO's type, as with @Body()
    return idemDb
      .tx(idem.tx) // Kysely's Transaction<Database>: the insert commits with the key and the reply
      .insertInto("payments")
      .values({ account: idem.scope, amount_cents })
      .returningAll()
      .executeTakeFirstOrThrow();
  }
}

@Module({
  imports: [IdempotencyModule.forRoot({ store, scope: (req: Request) => req.header("x-account") })],
  controllers: [PaymentsController],
})
class AppModule {}
// #endregion snippet

const app = await NestFactory.create(AppModule, { rawBody: true, logger: false });
await app.listen(0, "127.0.0.1");
await tryTwice(`http://127.0.0.1:${app.getHttpServer().address().port}/payments`, async () => {
  const row = await db
    .selectFrom("payments")
    .select((e) => e.fn.countAll<number>().as("n"))
    .executeTakeFirstOrThrow();
  return Number(row.n);
});
await app.close();
await idemDb.close();
