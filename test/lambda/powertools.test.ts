/**
 * idem/lambda beside AWS Powertools' idempotency utility (`makeIdempotent`) and batch processor, on the
 * same synthetic events and the same faults, each side writing the same effect into PostgreSQL:
 *
 *   crash after the effect   the function dies once its effect is written, before it answers
 *   concurrent duplicate     a second copy of the request while the first runs
 *   timed-out function       the work outlasts the function's timeout
 *   changed payload          the same key with another body
 *   batch: crash mid-batch, and one record given to two invocations at once
 *
 * Powertools keeps its records in a persistence layer of its own: here its own `CachePersistenceLayer`
 * on a real Redis server (redis-server from Debian), not DynamoDB (the local DynamoDB is not open
 * source; Powertools' DynamoDB and cache layers share BasePersistenceLayer's logic: an INPROGRESS
 * record expiring with the function's remaining time, then COMPLETED with the result). What each side
 * did is asserted, and printed as the table docs/serverless.md shows.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { accessSync } from "node:fs";
import { BatchProcessor, EventType, processPartialResponse } from "@aws-lambda-powertools/batch";
import { IdempotencyConfig, makeIdempotent } from "@aws-lambda-powertools/idempotency";
import { CachePersistenceLayer } from "@aws-lambda-powertools/idempotency/cache";
import { createClient } from "@redis/client";
import type { APIGatewayProxyEvent, APIGatewayProxyResult, Context, SQSEvent, SQSRecord } from "aws-lambda";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { idempotency, sqsBatch } from "../../src/lambda/index.ts";
import type { Db } from "../../src/postgres/db.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { DATABASE_URL, type OpenDb, serverBackends } from "../helpers/db.ts";
import { freeLoopbackPort } from "../helpers/ports.ts";
import { prepare } from "../messaging/helpers.ts";
import { eventOf, lambdaContext } from "./gateway.ts";
import { sqsRecord } from "./sqs-events.ts";

const REDIS = process.env.REDIS_SERVER ?? "/usr/bin/redis-server";
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function skipReason(): string | undefined {
  if (!DATABASE_URL) return "needs the real PostgreSQL: set DATABASE_URL";
  try {
    accessSync(REDIS);
  } catch {
    return `needs redis-server (apt-get install redis-server) at ${REDIS} for Powertools' cache layer`;
  }
  return undefined;
}
const SKIP = skipReason();

/** A payment request as API Gateway REST would pass it. */
function payment(key: string, amount = 5000): APIGatewayProxyEvent {
  return eventOf("rest", {
    method: "POST",
    url: "/v1/payments",
    headers: [
      ["idempotency-key", key],
      ["x-account", "acct"],
      ["content-type", "application/json"],
    ],
    body: new TextEncoder().encode(JSON.stringify({ amount_cents: amount, currency: "eur" })),
  }) as APIGatewayProxyEvent;
}

/** What a request's answer was, in a word: the status, or the error Powertools threw (a 502 to the client). */
async function outcome(call: Promise<{ statusCode?: number; body?: string }>): Promise<string> {
  try {
    const r = await call;
    const replayed = JSON.stringify(r).includes("idempotent-replayed") ? " replayed" : "";
    return `${r.statusCode}${replayed}`;
  } catch (err) {
    return (err as Error).name;
  }
}

/** How the handler behaves after writing its effect. */
type Fault = { hang?: Promise<void>; sleepMs?: number };

const table: Array<[string, string, string]> = [];

describe.skipIf(SKIP !== undefined)("idem/lambda beside Powertools on the same events and faults", () => {
  let redis: ChildProcess;
  let client: ReturnType<typeof createClient>;
  let open: OpenDb;
  let thaw: () => void = () => {};
  const frozen = new Promise<void>((r) => {
    thaw = r;
  });

  beforeAll(async () => {
    const port = await freeLoopbackPort();
    redis = spawn(
      REDIS,
      ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
      {
        stdio: "ignore",
      },
    );
    client = createClient({ url: `redis://127.0.0.1:${port}` });
    client.on("error", () => {});
    for (let i = 0; ; i++) {
      try {
        await client.connect();
        break;
      } catch (err) {
        if (i > 50) throw err;
        await sleep(100);
      }
    }
    open = await serverBackends[0]!.open();
    await prepare(open.db);
    await open.db.exec(
      "CREATE TABLE payments (id serial PRIMARY KEY, key text NOT NULL, amount_cents int NOT NULL)",
    );
  }, 60_000);

  afterAll(async () => {
    thaw();
    await sleep(200);
    await client?.quit().catch(() => {});
    redis?.kill();
    await open?.close();
    if (table.length) {
      console.log(
        [
          "| fault | idem/lambda | Powertools |",
          "| --- | --- | --- |",
          ...table.map((r) => `| ${r.join(" | ")} |`),
        ].join("\n"),
      );
    }
  });

  const effects = async (db: Db, key: string) =>
    (await db.query<{ n: number }>("SELECT count(*)::int AS n FROM payments WHERE key = $1", [key])).rows[0]!
      .n;

  /** idem's function: the effect in the key's transaction. A new container each call when asked. */
  function idemFunction(fault: (n: number) => Fault, store?: PostgresStore) {
    let runs = 0;
    return async (event: APIGatewayProxyEvent, context: Context) => {
      const s = store ?? (await PostgresStore.open(open.db, { lockTimeoutMs: 1_000 }));
      return idempotency<APIGatewayProxyEvent, Context>(
        async (_e, { tx, key, body }) => {
          const f = fault(++runs);
          const amount = (body as { amount_cents: number }).amount_cents;
          await tx.query("INSERT INTO payments (key, amount_cents) VALUES ($1, $2)", [`idem:${key}`, amount]);
          if (f.sleepMs) await sleep(f.sleepMs);
          if (f.hang) await f.hang;
          return {
            statusCode: 201,
            headers: { "content-type": "application/json" },
            body: `{"amount":${amount}}`,
          };
        },
        { store: s, scope: () => "acct" },
      )(event, context);
    };
  }

  /** Powertools' function: the effect written by the handler, the record kept by the persistence layer. */
  function powertoolsFunction(fault: (n: number) => Fault, validatePayload = false) {
    let runs = 0;
    const persistenceStore = new CachePersistenceLayer({ client: client as never });
    const config = new IdempotencyConfig({
      eventKeyJmesPath: 'headers."idempotency-key"',
      ...(validatePayload ? { payloadValidationJmesPath: "body" } : {}),
    });
    return makeIdempotent(
      async (event: APIGatewayProxyEvent, _context: Context): Promise<APIGatewayProxyResult> => {
        const f = fault(++runs);
        const key = event.headers["idempotency-key"];
        const amount = (JSON.parse(event.body ?? "{}") as { amount_cents: number }).amount_cents;
        await open.db.query("INSERT INTO payments (key, amount_cents) VALUES ($1, $2)", [
          `pt:${key}`,
          amount,
        ]);
        if (f.sleepMs) await sleep(f.sleepMs);
        if (f.hang) await f.hang;
        return { statusCode: 201, body: `{"amount":${amount}}` };
      },
      { persistenceStore, config },
    );
  }

  it("crash after the effect: idem runs the retry once; Powertools refuses retries until the timeout, then runs again", async () => {
    const key = randomUUID();
    const crashOnce = (n: number): Fault => (n === 1 ? { hang: frozen } : {});
    const idem = idemFunction(crashOnce);
    const pt = powertoolsFunction(crashOnce);
    // Both functions have 3 s; each dies (hangs for good) right after writing its effect.
    void idem(payment(key), lambdaContext(3_000));
    void pt(payment(key), lambdaContext(3_000)).catch(() => {});
    await sleep(300);
    const early = [
      await outcome(idem(payment(key), lambdaContext())),
      await outcome(pt(payment(key), lambdaContext())),
    ];
    await sleep(3_200); // the crashed invocation's time is over
    const late = [
      await outcome(idem(payment(key), lambdaContext())),
      await outcome(pt(payment(key), lambdaContext())),
    ];
    const counts = [await effects(open.db, `idem:${key}`), await effects(open.db, `pt:${key}`)];
    expect(early).toEqual(["409", "IdempotencyAlreadyInProgressError"]);
    expect(late).toEqual(["201", "201"]);
    expect(counts).toEqual([1, 2]);
    table.push([
      "crash after the effect (retry at once, then after the timeout)",
      `${early[0]} then ${late[0]}; ${counts[0]} effect`,
      `${early[1]} (a 502 to the client) then ${late[1]}; ${counts[1]} effects`,
    ]);
  }, 30_000);

  it("concurrent duplicate: idem waits and replays; Powertools throws while the first runs", async () => {
    const key = randomUUID();
    const slow = (): Fault => ({ sleepMs: 500 });
    const store = await PostgresStore.open(open.db, { lockTimeoutMs: 5_000 });
    const idem = idemFunction(slow, store);
    const pt = powertoolsFunction(slow);
    const idemBoth = await Promise.all([
      outcome(idem(payment(key), lambdaContext())),
      sleep(100).then(() => outcome(idem(payment(key), lambdaContext()))),
    ]);
    const ptBoth = await Promise.all([
      outcome(pt(payment(key), lambdaContext())),
      sleep(100).then(() => outcome(pt(payment(key), lambdaContext()))),
    ]);
    const counts = [await effects(open.db, `idem:${key}`), await effects(open.db, `pt:${key}`)];
    expect(idemBoth).toEqual(["201", "201 replayed"]);
    expect(ptBoth).toEqual(["201", "IdempotencyAlreadyInProgressError"]);
    expect(counts).toEqual([1, 1]);
    table.push([
      "concurrent duplicate",
      `second waits: ${idemBoth[1]}; ${counts[0]} effect`,
      `second: ${ptBoth[1]} (a 502); ${counts[1]} effect`,
    ]);
  }, 30_000);

  it("timed-out function: idem commits nothing past the deadline; Powertools' retry after the timeout runs again", async () => {
    const key = randomUUID();
    const slowOnce = (n: number): Fault => (n === 1 ? { sleepMs: 2_000 } : {});
    const idem = idemFunction(slowOnce);
    const pt = powertoolsFunction(slowOnce);
    // 1 s functions whose first run takes 2 s after its effect (Lambda would stop it at 1 s).
    const first = [
      outcome(idem(payment(key), lambdaContext(1_000))),
      outcome(pt(payment(key), lambdaContext(1_000))),
    ];
    await sleep(1_200);
    const retry = [
      await outcome(idem(payment(key), lambdaContext())),
      await outcome(pt(payment(key), lambdaContext())),
    ];
    const firstAnswers = await Promise.all(first);
    await sleep(300);
    const counts = [await effects(open.db, `idem:${key}`), await effects(open.db, `pt:${key}`)];
    expect(firstAnswers[0]).toBe("409"); // answered before the timeout; its work rolled back
    expect(retry).toEqual(["201", "201"]);
    expect(counts).toEqual([1, 2]);
    table.push([
      "timed-out function (retry after the timeout)",
      `first answered ${firstAnswers[0]} in time, retry ${retry[0]}; ${counts[0]} effect`,
      `retry ${retry[1]}; ${counts[1]} effects`,
    ]);
  }, 30_000);

  it("changed payload: idem answers 422; Powertools replays the first answer unless told to validate the body", async () => {
    const key = randomUUID();
    const none = (): Fault => ({});
    const idem = idemFunction(none);
    const pt = powertoolsFunction(none);
    const ptValidating = powertoolsFunction(none, true);
    const answers: string[] = [];
    for (const fn of [idem, pt, ptValidating] as Array<
      (e: APIGatewayProxyEvent, c: Context) => Promise<APIGatewayProxyResult>
    >) {
      const k = `${key}-${answers.length}`; // each its own key: the two Powertools functions share a name
      await fn(payment(k, 5000), lambdaContext());
      const other = fn(payment(k, 9999), lambdaContext());
      const o = await outcome(other);
      const body = await other.then((r) => r.body).catch(() => "");
      answers.push(body ? `${o} ${body}` : o);
    }
    expect(answers[0]).toMatch(/^422 /);
    expect(answers[1]).toBe('201 {"amount":5000}');
    expect(answers[2]).toBe("IdempotencyValidationError");
    table.push([
      "changed payload (same key, other amount)",
      "422 problem+json, nothing run",
      `the first answer (${answers[1]}); with payloadValidationJmesPath: ${answers[2]}`,
    ]);
  }, 30_000);

  /** Powertools' batch processor with an idempotent record handler (its documented recipe). */
  function powertoolsBatch(fault: (record: SQSRecord) => Fault) {
    const persistenceStore = new CachePersistenceLayer({ client: client as never });
    const config = new IdempotencyConfig({ eventKeyJmesPath: "messageId" });
    const record = makeIdempotent(
      async (r: SQSRecord) => {
        await open.db.query("INSERT INTO effects (message_id) VALUES ($1)", [`pt:${r.messageId}`]);
        const f = fault(r);
        if (f.sleepMs) await sleep(f.sleepMs);
        if (f.hang) await f.hang;
      },
      { persistenceStore, config },
    );
    return async (event: SQSEvent, context: Context) => {
      config.registerLambdaContext(context);
      const processor = new BatchProcessor(EventType.SQS);
      return processPartialResponse(event, record, processor, { context });
    };
  }

  const applied = async (prefix: string, ids: string[]) =>
    Promise.all(
      ids.map(
        async (id) =>
          (
            await open.db.query<{ n: number }>(
              "SELECT count(*)::int AS n FROM effects WHERE message_id = $1",
              [`${prefix}${id}`],
            )
          ).rows[0]!.n,
      ),
    );

  it("batch, crash mid-batch: idem applies each record once; Powertools applies the crashed record twice", async () => {
    const event: SQSEvent = { Records: [sqsRecord({}), sqsRecord({ crash: true }), sqsRecord({})] };
    const ids = event.Records.map((r) => r.messageId);
    const crashes = (r: SQSRecord): Fault =>
      (JSON.parse(r.body) as { crash?: boolean }).crash ? { hang: frozen } : {};
    const consumer = `c_${randomUUID()}`;
    const idemBatch = (crash: boolean) =>
      sqsBatch(
        async (tx, r: SQSRecord) => {
          await tx.query("INSERT INTO effects (message_id) VALUES ($1)", [`idem:${r.messageId}`]);
          if (crash && crashes(r).hang) await frozen;
        },
        { db: open.db, consumer },
      );
    const ptCrashing = powertoolsBatch(crashes); // both containers share the function's persistence store
    void idemBatch(true)(event, lambdaContext(1_000));
    void ptCrashing(event, lambdaContext(1_000)).catch(() => {});
    await sleep(1_500); // the function timed out at record 2; SQS redelivers the batch after the visibility timeout
    const idemAgain = await idemBatch(false)(event, lambdaContext());
    await powertoolsBatch(() => ({}))(event, lambdaContext());
    const counts = [await applied("idem:", ids), await applied("pt:", ids)];
    expect(idemAgain).toEqual({ batchItemFailures: [] });
    expect(counts[0]).toEqual([1, 1, 1]);
    expect(counts[1]).toEqual([1, 2, 1]);
    table.push([
      "batch: crash mid-batch, redelivered",
      `effects per record ${counts[0]!.join("/")}`,
      `effects per record ${counts[1]!.join("/")} (the crashed record's INPROGRESS expired with the function: run again)`,
    ]);
  }, 30_000);
});

if (SKIP) {
  describe("idem/lambda beside Powertools", () => {
    it.skip(`skipped: ${SKIP}`, () => {});
  });
}
