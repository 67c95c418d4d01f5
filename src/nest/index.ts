/**
 * NestJS (`idem/nestjs`), on Express or on Fastify:
 *
 *   @Module({ imports: [IdempotencyModule.forRoot({ store, scope: (req) => req.user?.accountId })], ... })
 *   class AppModule {}
 *
 *   @Controller("charges")
 *   class ChargesController {
 *     @Post() @Idempotent()
 *     async create(@Body() dto: ChargeDto, @IdempotencyCtx() idem: NestIdempotencyContext) {
 *       const [charge] = await idemDb.tx(idem.tx).insert(charges).values({ ... }).returning();
 *       return charge; // saved with the key, in the insert's transaction; replayed byte for byte
 *     }
 *   }
 *
 * `forRoot` registers `IdempotencyInterceptor` globally (APP_INTERCEPTOR); it acts on the handlers
 * marked `@Idempotent()` or `@IdempotentPhases(runner)` only. Create the app with `{ rawBody: true }`
 * so that the fingerprint and the duplicate-key check see the bytes sent.
 */
import type { IncomingMessage } from "node:http";
import { createParamDecorator, type DynamicModule, type ExecutionContext } from "@nestjs/common";
import { APP_INTERCEPTOR, HttpAdapterHost } from "@nestjs/core";
import {
  IDEMPOTENCY_OPTIONS,
  IdempotencyInterceptor,
  type IdempotencyModuleOptions,
  idempotencyOf,
  type NestIdempotencyContext,
} from "./interceptor.ts";

export {
  IDEMPOTENCY_OPTIONS,
  IdempotencyInterceptor,
  type IdempotencyModuleOptions,
  Idempotent,
  IdempotentPhases,
  type IdempotentPhasesRouteOptions,
  type IdempotentRouteOptions,
  idempotencyOf,
  type NestIdempotencyContext,
} from "./interceptor.ts";

/** The request's idempotency context (`tx`, `key`, `scope`, `body`) in an `@Idempotent()` handler. */
export const IdempotencyCtx: () => ParameterDecorator = createParamDecorator(
  (_data: unknown, ctx: ExecutionContext): NestIdempotencyContext =>
    idempotencyOf(ctx.switchToHttp().getRequest()),
);

/** The Nest module: `IdempotencyModule.forRoot({ store, scope })` (or `forRootAsync`) in the app module. */
// A plain class (no @Module): its dynamic modules carry all the metadata, and idem needs no decorators.
// biome-ignore lint/complexity/noStaticOnlyClass: a Nest module is a class, configured by forRoot()
export class IdempotencyModule {
  /** The store and scope given as they are. */
  static forRoot<Req = IncomingMessage>(options: IdempotencyModuleOptions<Req>): DynamicModule {
    return IdempotencyModule.forRootAsync({ useFactory: () => options });
  }

  /** The options from a factory with injected dependencies (e.g. a store opened by another provider). */
  static forRootAsync(options: {
    imports?: DynamicModule["imports"];
    inject?: any[];
    useFactory: (...deps: any[]) => IdempotencyModuleOptions<any> | Promise<IdempotencyModuleOptions<any>>;
  }): DynamicModule {
    return {
      module: IdempotencyModule,
      global: true,
      imports: options.imports ?? [],
      providers: [
        { provide: IDEMPOTENCY_OPTIONS, useFactory: options.useFactory, inject: options.inject ?? [] },
        {
          provide: APP_INTERCEPTOR,
          // The application's HTTP adapter, so that answers are sent without Nest's streaming path.
          useFactory: (o: IdempotencyModuleOptions<any>, host?: HttpAdapterHost) =>
            new IdempotencyInterceptor(o, host?.httpAdapter),
          inject: [IDEMPOTENCY_OPTIONS, { token: HttpAdapterHost, optional: true }],
        },
      ],
      exports: [IDEMPOTENCY_OPTIONS],
    };
  }
}
