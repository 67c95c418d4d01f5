/**
 * `idem/nestjs` through a real Nest app over HTTP, on Express and on Fastify, with Drizzle writing in
 * the key's transaction (`idem/drizzle`): the handler is plain Nest (`@Post`, `@Body`, `@Headers`) plus
 * `@Idempotent()` and `@IdempotencyCtx()`. Each platform gets a database of its own.
 */
import type { IncomingMessage } from "node:http";
import "reflect-metadata";
import { randomBytes, randomUUID } from "node:crypto";
import type { AddressInfo } from "node:net";
import { Body, Controller, Headers, type INestApplication, Module, Post, Res } from "@nestjs/common";
import { NestFactory } from "@nestjs/core";
import { FastifyAdapter } from "@nestjs/platform-fastify";
import { drizzle } from "drizzle-orm/node-postgres";
import { integer, pgTable, serial, text } from "drizzle-orm/pg-core";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  IDEMPOTENCY_OPTIONS,
  IdempotencyCtx,
  IdempotencyInterceptor,
  IdempotencyModule,
  Idempotent,
  type NestIdempotencyContext,
} from "../../src/nest/index.ts";
import { fromDrizzle } from "../../src/orm/drizzle.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { DATABASE_URL, freshDatabase, sayWhySkippedWithoutServer } from "../helpers/db.ts";
import { PAYMENTS_DDL } from "../orm/harness.ts";

sayWhySkippedWithoutServer();

const payments = pgTable("payments", {
  id: serial().primaryKey(),
  account: text().notNull(),
  amountCents: integer("amount_cents").notNull(),
  currency: text().notNull(),
});

type IdemDb = ReturnType<typeof fromDrizzle<ReturnType<typeof drizzle>>>;

function appModule(idemDb: IdemDb, store: PostgresStore, byHand = false) {
  @Controller("v1")
  class PaymentsController {
    @Post("payments")
    @Idempotent()
    async create(
      @Body() body: { amount_cents: number; currency: string },
      @IdempotencyCtx() idem: NestIdempotencyContext,
      @Headers("x-crash") crash?: string,
    ) {
      const account = idem.scope!;
      const [row] = await idemDb
        .tx(idem.tx)
        .insert(payments)
        .values({ account, amountCents: body.amount_cents, currency: body.currency })
        .returning({ id: payments.id });
      if (crash) throw new Error("the handler crashed after its ORM write");
      // a fresh receipt on every execution: a replay that ran the handler again would show
      return {
        id: row!.id,
        account,
        amount_cents: body.amount_cents,
        receipt: randomBytes(8).toString("hex"),
      };
    }

    /** A cookie set on the platform's response (Express's res, Fastify's reply), as Nest's passthrough allows. */
    @Post("sessions")
    @Idempotent()
    session(@Res({ passthrough: true }) res: { header(name: string, value: string): unknown }) {
      res.header("set-cookie", "session=s1; HttpOnly");
      return { ok: true };
    }

    /** A receipt as bytes that are not UTF-8, with a status other than the route's 201. */
    @Post("receipts")
    @Idempotent()
    receipt() {
      const bytes = Buffer.concat([Buffer.from([0xff, 0xfe, 0x00, 0x80]), randomBytes(16)]);
      return new Response(bytes, { status: 200, headers: { "content-type": "application/octet-stream" } });
    }
  }

  // Without the module: its options provided as they are, and the interceptor built by hand (startApp),
  // with no HTTP adapter.
  @Module({
    imports: byHand ? [] : [IdempotencyModule.forRoot({ store, scope: scopeOf })],
    providers: byHand ? [{ provide: IDEMPOTENCY_OPTIONS, useValue: { store, scope: scopeOf } }] : [],
    controllers: [PaymentsController],
  })
  class AppModule {}
  return AppModule;
}

/** Express's and Fastify's requests both carry Node's headers. */
function scopeOf(req: IncomingMessage): string | undefined {
  const account = req.headers["x-account"];
  return typeof account === "string" ? account : undefined;
}

/** A Nest app on a database of its own, listening on loopback. */
async function startApp(adapter: FastifyAdapter | undefined, byHand = false) {
  const fresh = await freshDatabase("nest");
  const pool = new pg.Pool({ connectionString: fresh.url, max: 10 });
  // The database is dropped (WITH FORCE) at the end: a connection it kills while the pool ends must
  // not become an uncaught error that fails the whole run.
  pool.on("error", () => {});
  const idemDb = fromDrizzle(drizzle(pool));
  await migrate(idemDb);
  await idemDb.exec(PAYMENTS_DDL);
  const store = await PostgresStore.open(idemDb);
  const module = appModule(idemDb, store, byHand);
  const options = { rawBody: true, logger: false as const };
  const app = adapter
    ? await NestFactory.create(module, adapter, options)
    : await NestFactory.create(module, options);
  if (byHand) app.useGlobalInterceptors(new IdempotencyInterceptor({ store, scope: scopeOf }));
  await app.listen(0, "127.0.0.1");
  const base = `http://127.0.0.1:${(app.getHttpServer().address() as AddressInfo).port}`;
  return { fresh, idemDb, app, base };
}

/** `send` (one keyed request to /v1/sessions) gets its cookie once, first, and a replay without it. */
async function expectCookieOnce(send: () => Promise<Response>): Promise<void> {
  const first = await send();
  const body = await first.text();
  expect(first.status).toBe(201);
  expect(first.headers.getSetCookie()).toEqual(["session=s1; HttpOnly"]);
  const retry = await send();
  expect(retry.headers.get("idempotent-replayed")).toBe("true");
  expect(retry.headers.getSetCookie()).toEqual([]);
  expect(await retry.text()).toBe(body);
}

const platforms = [
  { name: "Express", adapter: () => undefined },
  { name: "Fastify", adapter: () => new FastifyAdapter() },
];

describe.skipIf(!DATABASE_URL).each(platforms)("NestJS on $name with Drizzle", ({ adapter }) => {
  let fresh: Awaited<ReturnType<typeof freshDatabase>>;
  let idemDb: IdemDb;
  let app: INestApplication;
  let base: string;
  beforeAll(async () => {
    ({ fresh, idemDb, app, base } = await startApp(adapter()));
  }, 60_000);
  afterAll(async () => {
    await app?.close();
    await idemDb?.close(); // ends the pool (fromDrizzle owns it)
    await fresh?.drop();
  });

  const post = (acct: string, key: string | undefined, init: { headers?: object; body?: object } = {}) =>
    fetch(`${base}/v1/payments`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-account": acct,
        ...(key ? { "idempotency-key": key } : {}),
        ...init.headers,
      },
      body: JSON.stringify(init.body ?? { amount_cents: 5000, currency: "eur" }),
    });
  const count = async (sql: string, acct: string) =>
    (await idemDb.query<{ n: number }>(sql, [acct])).rows[0]!.n;
  const rows = (acct: string) => count("SELECT count(*)::int AS n FROM payments WHERE account = $1", acct);
  const keys = (acct: string) => count("SELECT count(*)::int AS n FROM idem.keys WHERE scope = $1", acct);
  const account = () => `acct_${randomBytes(6).toString("hex")}`;
  /** Sends `{}` to `path` with one new account and key, the same each time it is called. */
  const keyedEmptyPost = (path: string) => {
    const headers = {
      "content-type": "application/json",
      "x-account": account(),
      "idempotency-key": randomUUID(),
    };
    return () => fetch(`${base}${path}`, { method: "POST", headers, body: "{}" });
  };

  it("runs a keyed request once and replays the same bytes, status and content type", async () => {
    const acct = account();
    const key = randomUUID();
    const first = await post(acct, key);
    const body = await first.text();
    expect(first.status).toBe(201);
    expect(first.headers.get("idempotent-replayed")).toBeNull();
    expect(JSON.parse(body)).toMatchObject({ account: acct, amount_cents: 5000 });
    const retry = await post(acct, key);
    expect(retry.status).toBe(201);
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(retry.headers.get("content-type")).toBe(first.headers.get("content-type"));
    expect(await retry.text()).toBe(body);
    expect(await rows(acct)).toBe(1);
  });

  it("sends a keyed answer whole, with its length, its status and bytes as saved, first and replayed", async () => {
    const send = keyedEmptyPost("/v1/receipts");
    const first = await send();
    const bytes = Buffer.from(await first.arrayBuffer());
    const retry = await send();
    const again = Buffer.from(await retry.arrayBuffer());
    expect([first.status, retry.status]).toEqual([200, 200]);
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(bytes.subarray(0, 4)).toEqual(Buffer.from([0xff, 0xfe, 0x00, 0x80]));
    expect(again.equals(bytes)).toBe(true);
    for (const res of [first, retry]) {
      // One sized answer, as Nest sends a route's own result: not a stream in chunks.
      expect(res.headers.get("content-length")).toBe(String(bytes.length));
      expect(res.headers.get("transfer-encoding")).toBeNull();
      expect(res.headers.get("content-type")).toBe("application/octet-stream");
    }
  });

  it("sends a cookie the handler set on the platform's response once, and never replays it", async () => {
    await expectCookieOnce(keyedEmptyPost("/v1/sessions"));
  });

  it("commits nothing when the handler throws after its ORM write, and the retry runs", async () => {
    const acct = account();
    const key = randomUUID();
    const crash = await post(acct, key, { headers: { "x-crash": "1" } });
    expect(crash.status).toBe(500);
    expect(await rows(acct)).toBe(0);
    expect(await keys(acct)).toBe(0);
    const retry = await post(acct, key);
    expect(retry.status).toBe(201);
    expect(retry.headers.get("idempotent-replayed")).toBeNull();
    expect(await rows(acct)).toBe(1);
  });

  it("runs 50 concurrent duplicates once, and all of them get the same body", async () => {
    const acct = account();
    const key = randomUUID();
    const replies = await Promise.all(
      Array.from({ length: 50 }, async () => {
        const res = await post(acct, key);
        return { status: res.status, body: await res.text() };
      }),
    );
    expect(replies.map((r) => r.status)).toEqual(Array(50).fill(201));
    expect(new Set(replies.map((r) => r.body)).size).toBe(1);
    expect(await rows(acct)).toBe(1);
  }, 60_000);

  it("answers a missing key 400 and another body under the key 422, as problem+json, running nothing", async () => {
    const acct = account();
    const missing = await post(acct, undefined);
    expect(missing.status).toBe(400);
    expect(missing.headers.get("content-type")).toBe("application/problem+json");
    const key = randomUUID();
    await post(acct, key);
    const other = await post(acct, key, { body: { amount_cents: 9999, currency: "eur" } });
    expect(other.status).toBe(422);
    expect((await other.json()).type).toBe("urn:idem:problem:idempotency-key-mismatch");
    expect(await rows(acct)).toBe(1);
  });

  it("refuses a JSON body with a duplicate key 400 before claiming (it sees the bytes sent)", async () => {
    const acct = account();
    const res = await fetch(`${base}/v1/payments`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-account": acct, "idempotency-key": randomUUID() },
      body: '{"amount_cents":5000,"currency":"eur","amount_cents":1}',
    });
    expect(res.status).toBe(400);
    expect(await keys(acct)).toBe(0);
    expect(await rows(acct)).toBe(0);
  });
});

describe.skipIf(!DATABASE_URL).each(platforms)(
  "NestJS on $name, the interceptor built by hand",
  ({ adapter }) => {
    let started: Awaited<ReturnType<typeof startApp>>;
    beforeAll(async () => {
      started = await startApp(adapter(), true);
    }, 60_000);
    afterAll(async () => {
      await started?.app.close();
      await started?.idemDb.close();
      await started?.fresh.drop();
    });

    it("sends a cookie the handler set on the platform's response once, and never replays it", async () => {
      const headers = {
        "content-type": "application/json",
        "x-account": "acct_h",
        "idempotency-key": randomUUID(),
      };
      await expectCookieOnce(() =>
        fetch(`${started.base}/v1/sessions`, { method: "POST", headers, body: "{}" }),
      );
    });
  },
);
