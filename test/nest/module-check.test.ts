/**
 * `@Idempotent()` / `@IdempotentPhases()` without `IdempotencyModule.forRoot()`: the app must refuse to
 * start (app.init() rejects, naming the fix), not answer each request with an error later.
 */
import "reflect-metadata";
import { Controller, Module, Post } from "@nestjs/common";
import { NestFactory } from "@nestjs/core";
import { FastifyAdapter } from "@nestjs/platform-fastify";
import { describe, expect, it } from "vitest";
import { IdempotencyModule, Idempotent, IdempotentPhases } from "../../src/nest/index.ts";

// Never used: no request is sent; it only has to look like a store for the module's option check.
const store = { atomic: async () => {}, transaction: async () => {} } as never;
const runner = { run: async () => ({ status: 200, headers: [], body: new Uint8Array(0) }) } as never;

function appModule(withModule: boolean, phases = false) {
  @Controller("v1")
  class PaymentsController {
    @Post("payments")
    @Idempotent()
    create() {
      return { ok: true };
    }
  }
  @Controller("v2")
  class PhasesController {
    @Post("payments")
    @IdempotentPhases(runner)
    create() {
      return {};
    }
  }
  const imports = withModule ? [IdempotencyModule.forRoot({ store: store, scope: () => "a" })] : [];
  @Module({ imports, controllers: [phases ? PhasesController : PaymentsController] })
  class AppModule {}
  return AppModule;
}

const platforms = [
  { name: "Express", adapter: () => undefined },
  { name: "Fastify", adapter: () => new FastifyAdapter() },
];

describe.each(platforms)("NestJS on $name without IdempotencyModule.forRoot()", ({ adapter }) => {
  async function create(module: object) {
    const a = adapter();
    const options = { logger: false as const, abortOnError: false };
    return a ? NestFactory.create(module as never, a, options) : NestFactory.create(module as never, options);
  }

  it.each([false, true])("fails app.init() naming the fix (phases route: %s)", async (phases) => {
    const app = await create(appModule(false, phases));
    try {
      await expect(app.init()).rejects.toThrow(/IdempotencyModule\.forRoot\(/);
    } finally {
      await app.close().catch(() => {});
    }
  });

  it("starts with the module imported", async () => {
    const app = await create(appModule(true));
    await expect(app.init()).resolves.toBe(app);
    await app.close();
  });
});
