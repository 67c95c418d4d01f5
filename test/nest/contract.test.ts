/**
 * The shared adapter contract (test/http/contract.ts and contract-lifecycle.ts) against `idem/nestjs`,
 * on Express and on Fastify: the same payments app, written the Nest way (a controller, `@Idempotent()`,
 * `@IdempotentPhases()`, validation that throws `BadRequestException`).
 */
import "reflect-metadata";
import type { AddressInfo } from "node:net";
import {
  BadRequestException,
  Body,
  Controller,
  Headers,
  type INestApplication,
  Module,
  Post,
} from "@nestjs/common";
import { NestFactory } from "@nestjs/core";
import { FastifyAdapter } from "@nestjs/platform-fastify";
import { describe } from "vitest";
import {
  IdempotencyCtx,
  IdempotencyModule,
  Idempotent,
  IdempotentPhases,
  type NestIdempotencyContext,
} from "../../src/nest/index.ts";
import { backends } from "../helpers/db.ts";
import {
  type AppParts,
  charge,
  mayReplay,
  PHASED_ANSWER_WITHIN_MS,
  paymentsContract,
  useApp,
  validatePayment,
} from "../http/contract.ts";
import { lifecycleContract } from "../http/contract-lifecycle.ts";

type Req = { headers: Record<string, string | undefined> };

function appModule({ store, runner }: AppParts) {
  const header = (req: Req) => (name: string) => req.headers[name];
  const pay = async (idem: NestIdempotencyContext, headers: Req["headers"]) => {
    if (typeof validatePayment(idem.body) === "string") throw new BadRequestException("invalid payment");
    const r = await charge(idem.tx, idem.scope, idem.body, (name) => headers[name]);
    const h = new globalThis.Headers({ "content-type": "application/json", location: r.location });
    h.append("set-cookie", r.cookie);
    return new Response(r.json, { status: r.status, headers: h });
  };

  @Controller("v1")
  class PaymentsController {
    @Post("payments")
    @Idempotent({ authorizeReplay: (req: Req) => mayReplay(header(req)) })
    payments(@IdempotencyCtx() idem: NestIdempotencyContext, @Headers() headers: Req["headers"]) {
      return pay(idem, headers);
    }

    @Post("tips")
    @Idempotent({ required: false })
    tips(@IdempotencyCtx() idem: NestIdempotencyContext, @Headers() headers: Req["headers"]) {
      return pay(idem, headers);
    }

    /** A phases route: the handler validates and returns the runner's input. */
    @Post("phased")
    @IdempotentPhases(runner, {
      answerWithinMs: PHASED_ANSWER_WITHIN_MS,
      authorizeReplay: (req: Req) => mayReplay(header(req)),
    })
    phased(@Body() body: unknown) {
      const p = validatePayment(body);
      if (typeof p === "string") throw new BadRequestException(p);
      return p;
    }
  }

  @Module({
    imports: [IdempotencyModule.forRoot({ store, scope: (req: Req) => req.headers["x-account"] })],
    controllers: [PaymentsController],
  })
  class AppModule {}
  return AppModule;
}

const platforms = [
  { platform: "Express", adapter: () => undefined },
  { platform: "Fastify", adapter: () => new FastifyAdapter() },
];

describe.each(platforms)("NestJS on $platform", ({ adapter }) => {
  describe.each(backends)("on $name", (backend) => {
    const app = useApp(backend, async (parts) => {
      const module = appModule(parts);
      const options = { rawBody: true, logger: false as const };
      const a = adapter();
      const nest: INestApplication = a
        ? await NestFactory.create(module, a, options)
        : await NestFactory.create(module, options);
      await nest.listen(0, "127.0.0.1");
      return {
        url: `http://127.0.0.1:${(nest.getHttpServer().address() as AddressInfo).port}`,
        close: () => nest.close(),
      };
    });
    paymentsContract(app, { hangUp: true });
    lifecycleContract(app);
  });
});
