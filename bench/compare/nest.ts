/**
 * The comparison's handler on NestJS (on Express, Nest's default platform), as Nest users write it: a
 * controller whose POST returns the row (answered 201). bare-nest writes it autocommitted, idem-nest in
 * the key's transaction (`@Idempotent()` and `@IdempotencyCtx()` from `idem/nestjs`, the app created
 * with `rawBody: true` as idem/nestjs documents), hand-tx-nest through hand.ts's pipelined transaction.
 * Its own module, loaded only by the Nest variants' servers: Nest and reflect-metadata stay out of the
 * others' processes.
 */
import "reflect-metadata";
import {
  BadRequestException,
  Body,
  ConflictException,
  Controller,
  Header,
  Headers,
  Module,
  Post,
} from "@nestjs/common";
import { NestFactory } from "@nestjs/core";
import { IdempotencyCtx, IdempotencyModule, Idempotent, type NestIdempotencyContext } from "idem/nestjs";
import { fromPg, PostgresStore } from "idem/postgres";
import { pool, type Started } from "./frameworks.ts";
import { CRASH_HEADER, insertPayment, PATH, type Payment, prepared } from "./handler.ts";
import { SCOPE, type Variant } from "./variants.ts";

async function listen(module: object, options: { rawBody?: boolean } = {}): Started {
  const app = await NestFactory.create(module, { ...options, logger: false });
  await app.listen(0, "127.0.0.1");
  return app.getHttpServer().address().port;
}

/** bare-nest and idem-nest. */
export async function startNest(v: Variant, url: string): Started {
  if (v.kind === "bare") {
    const db = prepared(pool(url));
    @Controller()
    class Payments {
      @Post(PATH)
      create(@Body() body: Payment, @Headers() headers: Record<string, string | undefined>) {
        return insertPayment(db, headers["idempotency-key"], body, headers[CRASH_HEADER] !== undefined);
      }
    }
    @Module({ controllers: [Payments] })
    class App {}
    return listen(App);
  }
  const store = await PostgresStore.open(fromPg(pool(url, true)));
  // The handler's only effect is its INSERT in the key's transaction, so it may be sent with the claim.
  const effectsInTxOnly = process.env.BENCH_NO_SPECULATE !== "1";
  @Controller()
  class Payments {
    @Post(PATH)
    @Idempotent()
    create(@IdempotencyCtx() idem: NestIdempotencyContext<Payment>, @Headers(CRASH_HEADER) crash?: string) {
      return insertPayment(idem.tx, idem.key, idem.body, crash !== undefined);
    }
  }
  @Module({
    imports: [IdempotencyModule.forRoot({ store, scope: () => SCOPE, effectsInTxOnly })],
    controllers: [Payments],
  })
  class App {}
  return listen(App, { rawBody: true });
}

/** hand-tx-nest: hand.ts's keyed handler (`answer`) in a controller; a key in flight is Nest's 409. */
export function startNestHand(
  answer: (key: string, body: Payment) => Promise<{ status: number; body: string }>,
) {
  @Controller()
  class Payments {
    @Post(PATH)
    @Header("content-type", "application/json")
    async create(@Body() body: Payment, @Headers("idempotency-key") key?: string) {
      if (!key) throw new BadRequestException("an Idempotency-Key is required");
      const reply = await answer(key, body);
      if (reply.status === 409) throw new ConflictException(reply.body);
      return reply.body; // the saved reply, as JSON text
    }
  }
  @Module({ controllers: [Payments] })
  class App {}
  return listen(App);
}
