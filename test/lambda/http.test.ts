/**
 * idem/lambda's HTTP handlers run the adapter contract suite (test/http/) through synthetic events of
 * each source (API Gateway REST and HTTP APIs, Function URL, ALB with and without multi-value headers),
 * then the cases Lambda adds: results replayed byte for byte, and the invocation's remaining time.
 */
import { randomUUID } from "node:crypto";
import type {
  APIGatewayProxyEvent,
  APIGatewayProxyEventV2,
  APIGatewayProxyResult,
  Context,
} from "aws-lambda";
import { describe, expect, it } from "vitest";
import { EventRequest } from "../../src/lambda/events.ts";
import {
  idempotency,
  idempotentPhases,
  type LambdaHttpEvent,
  type LambdaIdempotentHandler,
} from "../../src/lambda/index.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { backends, DATABASE_URL, serverBackends } from "../helpers/db.ts";
import {
  type AppParts,
  account,
  charge,
  INVALID_BODY,
  mayReplay,
  PHASED_ANSWER_WITHIN_MS,
  paymentsContract,
  phasedInput,
  useApp,
  validatePayment,
} from "../http/contract.ts";
import { lifecycleContract, ownBodyContract } from "../http/contract-lifecycle.ts";
import {
  type AnyEvent,
  eventOf,
  type LambdaFn,
  lambdaContext,
  type Source,
  startGateway,
} from "./gateway.ts";

const headerOf = (event: LambdaHttpEvent) => {
  const request = new EventRequest(event);
  return (name: string) => request.header(name);
};

/** The payments handler as a Lambda function writes it: validate, write, return a proxy result. */
const pay: LambdaIdempotentHandler<LambdaHttpEvent, Context, unknown, false> = async (
  event,
  { tx, scope, body },
) => {
  if (typeof validatePayment(body) === "string") {
    return { statusCode: 400, headers: { "content-type": "application/problem+json" }, body: INVALID_BODY };
  }
  const r = await charge(tx, scope, body, headerOf(event));
  return {
    statusCode: r.status,
    multiValueHeaders: {
      "content-type": ["application/json"],
      location: [r.location],
      "set-cookie": [r.cookie],
    },
    body: r.json,
  };
};

const crashes: unknown[] = [];

/** A valid payment of `account` under `key`, as `source`'s event. */
function paymentEvent(source: Source, account: string, key: string, more: Array<[string, string]> = []) {
  return eventOf(source, {
    method: "POST",
    url: "/v1/payments",
    headers: [
      ["x-account", account],
      ["idempotency-key", key],
      ["content-type", "application/json"],
      ...more,
    ],
    body: new TextEncoder().encode('{"amount_cents":5000,"currency":"eur"}'),
  });
}

function functions({ store, runner }: AppParts): Record<string, LambdaFn> {
  const scope = (event: LambdaHttpEvent) => headerOf(event)("x-account");
  const onError = (err: unknown) => crashes.push(err);
  const authorizeReplay = (event: LambdaHttpEvent) => mayReplay(headerOf(event));
  const fns = {
    "/v1/payments": idempotency(pay, { store, scope, onError, authorizeReplay }),
    "/v1/phased": idempotentPhases({
      runner,
      scope,
      onError,
      authorizeReplay,
      input: phasedInput,
      answerWithinMs: PHASED_ANSWER_WITHIN_MS,
    }),
    "/v1/tips": idempotency(pay, { store, scope, onError, required: false }),
    "/v1/small": idempotency(pay, { store, scope, onError, limit: 64 }),
  };
  return fns as unknown as Record<string, LambdaFn>;
}

/** Every source on the first backend; API Gateway REST (the most used) on every backend. */
const sources: Array<[Source, (typeof backends)[number]]> = [
  ...(["http", "url", "alb", "alb-multi"] as const).map((s): [Source, (typeof backends)[number]] => [
    s,
    serverBackends[0] ?? backends[0]!,
  ]),
  ...backends.map((b): [Source, (typeof backends)[number]] => ["rest", b]),
];

describe.each(sources)("Lambda handler behind %s on %s", (source, backend) => {
  const app = useApp(backend, (parts) => startGateway(source, functions(parts)));
  paymentsContract(app);
  lifecycleContract(app);
  ownBodyContract(app, crashes);
});

describe.each(backends)("Lambda results and remaining time on $name", (backend) => {
  const app = useApp(backend, () => startGateway("rest", {}));

  it("replays a binary body byte for byte as the same base64 result, in each source's format", async () => {
    let runs = 0;
    const bytes = Uint8Array.from([0, 255, 1, 254, 0x80, 0x7f]);
    const fn = idempotency(
      async () => {
        runs++;
        return {
          statusCode: 201,
          headers: { "content-type": "application/octet-stream" },
          body: Buffer.from(bytes).toString("base64"),
          isBase64Encoded: true,
        };
      },
      { store: app.store, scope: () => "acct_binary" },
    );
    for (const source of ["rest", "http", "url", "alb", "alb-multi"] as const) {
      const event = eventOf(source, {
        method: "POST",
        url: "/v1/blobs?a=1&b=x%20y",
        headers: [
          ["Idempotency-Key", `${source}-${randomUUID()}`],
          ["Content-Type", "application/json"],
        ],
        body: new TextEncoder().encode('{"n":1}'),
      }) as LambdaHttpEvent;
      const first = (await fn(event, lambdaContext())) as APIGatewayProxyResult;
      const again = (await fn(event, lambdaContext())) as APIGatewayProxyResult;
      expect(first.statusCode).toBe(201);
      expect(first.isBase64Encoded).toBe(true);
      expect(Buffer.from(first.body, "base64")).toEqual(Buffer.from(bytes));
      expect(again.body).toBe(first.body);
      expect(again.isBase64Encoded).toBe(true);
      const replayed = JSON.stringify(again).includes('"idempotent-replayed"');
      expect(replayed).toBe(true);
      if (source === "alb" || source === "alb-multi") {
        expect((first as { statusDescription?: string }).statusDescription).toBe("201 Created");
      }
    }
    expect(runs).toBe(5);
  });

  it.skipIf(!DATABASE_URL || backend.name === "pglite")(
    "answers a duplicate 409 before its own invocation times out, while the first still runs",
    async () => {
      const acct = account();
      const key = randomUUID();
      const fn = idempotency(pay, { store: app.store, scope: (e) => headerOf(e)("x-account") });
      const event = (sleep?: string) =>
        paymentEvent("http", acct, key, sleep ? [["x-sleep-ms", sleep]] : []) as APIGatewayProxyEventV2;
      const order: string[] = [];
      const first = fn(event("2500"), lambdaContext(30_000)).then((r) => {
        order.push("first");
        return r;
      });
      await new Promise((r) => setTimeout(r, 200));
      // A duplicate in a function with 1.2 s left (0.5 s kept back to answer): the store's own wait
      // (1 s, published) would outlast it, so the deadline answers.
      const dup = await fn(event(), lambdaContext(1_200));
      order.push("duplicate");
      expect(dup.statusCode).toBe(409);
      expect(JSON.parse((dup as { body: string }).body)).toMatchObject({
        operation_state: "in_progress",
        retry_same_key: true,
      });
      expect((await first).statusCode).toBe(201);
      expect(order).toEqual(["duplicate", "first"]);
      expect(await app.rows(acct)).toBe(1);
    },
  );

  it.skipIf(!DATABASE_URL || backend.name === "pglite")(
    "takes over the key of a function that timed out inside its transaction, and runs it once",
    async () => {
      const acct = account();
      const key = randomUUID();
      let thaw: () => void = () => {};
      const frozen = new Promise<void>((resolve) => {
        thaw = resolve;
      });
      let runs = 0;
      // Two containers: the one that froze, and the one the retry reaches (each its own store, as
      // each container opens its own at init; their in-process waits are their own).
      const containers = [app.store, await PostgresStore.open(app.db, { lockTimeoutMs: 1_000 })];
      const [frozenFn, retryFn] = containers.map((store) =>
        idempotency(
          async (event: APIGatewayProxyEvent, ctx) => {
            runs++;
            const r = await charge(ctx.tx, ctx.scope, ctx.body, headerOf(event));
            // The first run stops here, as a function Lambda froze at its timeout, its transaction open.
            if (runs === 1) await frozen;
            return { statusCode: 201, headers: { "content-type": "application/json" }, body: r.json };
          },
          { store, scope: (e) => headerOf(e)("x-account") },
        ),
      );
      const event = paymentEvent("rest", acct, key) as APIGatewayProxyEvent;
      // 1.5 s to live: answered 409 at 1 s, and the database ends its transaction at 1.5 s idle.
      try {
        const timedOut = await frozenFn!(event, lambdaContext(1_500));
        expect(timedOut.statusCode).toBe(409);
        // The retry reaches another container and gets the key once the database freed it.
        let retry = await retryFn!(event, lambdaContext(30_000));
        for (let i = 0; retry.statusCode === 409 && i < 20; i++) {
          await new Promise((r) => setTimeout(r, 250));
          retry = await retryFn!(event, lambdaContext(30_000));
        }
        expect(retry.statusCode).toBe(201);
        thaw(); // the frozen invocation resumes: its transaction is gone, it commits nothing
        await new Promise((r) => setTimeout(r, 300));
        const replay = await frozenFn!(event, lambdaContext(30_000));
        expect(replay.body).toBe(retry.body);
        expect(runs).toBe(2);
        expect(await app.rows(acct)).toBe(1);
      } finally {
        thaw();
      }
    },
    30_000,
  );

  it("reads the key, scope and body from each source's event the same way", () => {
    const raw = {
      method: "POST",
      url: "/v1/x?q=a%20b",
      headers: [
        ["Idempotency-Key", "k1"],
        ["X-Account", "acct"],
        ["Content-Type", "application/json"],
      ] as Array<[string, string]>,
      body: new TextEncoder().encode("{}"),
    };
    const seen = (["rest", "http", "url", "alb", "alb-multi"] as const).map((s) => {
      const r = new EventRequest(eventOf(s, raw) as AnyEvent as LambdaHttpEvent);
      return [r.method, r.path.split("?")[0], r.header("idempotency-key"), r.header("x-account")];
    });
    for (const s of seen) expect(s).toEqual(["POST", "/v1/x", "k1", "acct"]);
  });
});
