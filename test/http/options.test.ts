/**
 * Options are checked where the middleware is created: a missing or mistyped option fails at start-up
 * with an error naming the option and the fix, never with a TypeError on every request.
 */
import { describe, expect, it } from "vitest";
import { IdemOptionsError } from "../../src/core/index.ts";
import * as express from "../../src/http/express.ts";
import * as fastify from "../../src/http/fastify.ts";
import * as hono from "../../src/http/hono.ts";
import * as node from "../../src/http/node.ts";
import * as web from "../../src/http/web.ts";
import { IdempotencyInterceptor } from "../../src/nest/interceptor.ts";

const store = { retentionMs: 1, atomic: async () => ({}) as never, transaction: async () => ({}) as never };
const db = {
  query: async () => ({ rows: [], rowCount: 0 }),
  exec: async () => {},
  transaction: async () => {},
};
const scope = () => "acct";

const atomicFactories: Array<[string, (o: any) => unknown]> = [
  ["hono", (o) => hono.idempotency(o)],
  ["express", (o) => express.idempotency(o)],
  ["fastify", (o) => fastify.idempotency(o)],
  ["node", (o) => node.idempotency(async () => ({ status: 200 }), o)],
  ["web", (o) => web.idempotency(async () => new Response(), o)],
  ["nest", (o) => new IdempotencyInterceptor(o)],
];

describe.each(atomicFactories)("%s: options checked at creation", (_name, make) => {
  const refused = (o: unknown) => {
    try {
      make(o);
    } catch (err) {
      return err as IdemOptionsError;
    }
    throw new Error("accepted");
  };

  it("a scope that is missing or not a function names the option and the fix", () => {
    for (const bad of [undefined, "acct_1"]) {
      const err = refused({ store, scope: bad });
      expect(err).toBeInstanceOf(IdemOptionsError);
      expect(err.option).toBe("scope");
      expect(err.message).toMatch(/option "scope" must be a function .*e\.g\. scope:/);
    }
  });

  it("a missing store, or a database given as the store, says what to pass", () => {
    expect(refused({ scope }).message).toMatch(
      /option "store" is required: pass a store, e\.g\. await PostgresStore\.open\(db\); got nothing/,
    );
    expect(refused({ scope, store: db }).message).toMatch(
      /option "store" must be a store, not a database: pass await PostgresStore\.open\(db\)/,
    );
  });

  it("a callback that is not a function is refused; good options are taken", () => {
    expect(refused({ scope, store, authorizeReplay: true }).option).toBe("authorizeReplay");
    expect(() => make({ scope, store })).not.toThrow();
  });
});

describe("phases routes: runner and input checked at creation", () => {
  const runner = { run: async () => ({}) as never };
  it.each([
    ["hono", (o: any) => hono.idempotentPhases(o)],
    ["express", (o: any) => express.idempotentPhases(o)],
    ["fastify", (o: any) => fastify.idempotentPhases(o)],
    ["node", (o: any) => node.idempotentPhases(o)],
    ["web", (o: any) => web.idempotentPhases(o)],
  ])("%s", (_name, make) => {
    expect(() => make({ scope, input: () => ({}) })).toThrow(
      /option "runner" is required: pass definePhases/,
    );
    expect(() => make({ scope, runner })).toThrow(/option "input" must be a function/);
    expect(() => make({ scope, runner, input: () => ({}) })).not.toThrow();
  });
});

describe("one entry verb: idempotency() on every adapter", () => {
  it("node and web keep idempotent() as a deprecated alias for one release", () => {
    for (const adapter of [hono, express, fastify, node, web])
      expect(adapter.idempotency).toBeTypeOf("function");
    expect(node.idempotent).toBe(node.idempotency);
    expect(web.idempotent).toBe(web.idempotency);
  });
});
