// idem/lambda: an API Gateway handler and an SQS batch handler, invoked here with events shaped as
// Lambda passes them. Run it: DATABASE_URL=postgres://... npx tsx --conditions=source examples/lambda.ts
import type { APIGatewayProxyEvent, SQSRecord } from "aws-lambda"; // npm install -D @types/aws-lambda
import { idempotency, type LambdaContextLike, sqsBatch } from "idem/lambda";
import { fromPg, migrate, PostgresStore } from "idem/postgres";
import pg from "pg";
import { DATABASE_URL, PAYMENTS_TABLE } from "./try-twice.ts";

// The schema, made once by its owner (`idem migrate`), never inside the function.
const setup = fromPg(new pg.Pool({ connectionString: DATABASE_URL, max: 1 }));
await migrate(setup);
await setup.exec(PAYMENTS_TABLE);
await setup.close();

// #region snippet
// Outside the handler: once per container. With RDS Proxy, point DATABASE_URL at the proxy (a
// transaction pooler: idem keeps no session state outside a transaction).
const db = fromPg(new pg.Pool({ connectionString: DATABASE_URL, max: 1 }));
const store = await PostgresStore.open(db);

// API Gateway (REST or HTTP API), a Function URL or an ALB target: the same handler.
export const pay = idempotency<APIGatewayProxyEvent, LambdaContextLike, { amount_cents: number }>(
  async (_event, { tx, scope, body }) => {
    const { rows } = await tx.query(
      "INSERT INTO payments (account, amount_cents) VALUES ($1, $2) RETURNING id, amount_cents",
      [scope, body.amount_cents],
    );
    return {
      statusCode: 201,
      headers: { "content-type": "application/json" },
      body: JSON.stringify(rows[0]),
    };
  },
  // The scope comes from the authorizer (a verified identity), never from the body.
  { store, scope: (event) => event.requestContext.authorizer?.principalId as string | undefined },
);

// An SQS event source mapping with ReportBatchItemFailures: each record applied once.
export const credit = sqsBatch(
  async (tx, record: SQSRecord) => {
    const { account, amount_cents } = JSON.parse(record.body);
    await tx.query("INSERT INTO payments (account, amount_cents) VALUES ($1, $2)", [account, amount_cents]);
  },
  { db, consumer: "credits" },
);
// #endregion snippet

// ----- what Lambda would do: invoke them, twice -------------------------------------------------------
const context = { getRemainingTimeInMillis: () => 30_000 };
const account = `acct_${Date.now()}`;
const key = `order-${Math.random().toString(36).slice(2)}`;
const event = {
  httpMethod: "POST",
  path: "/payments",
  headers: { "Idempotency-Key": key, "Content-Type": "application/json" },
  body: JSON.stringify({ amount_cents: 5000 }),
  isBase64Encoded: false,
  requestContext: { authorizer: { principalId: account } },
} as unknown as APIGatewayProxyEvent;
const answers: string[] = [];
for (const attempt of [1, 2]) {
  const r = (await pay(event, context)) as { statusCode: number; body: string; multiValueHeaders: object };
  const replayed = JSON.stringify(r.multiValueHeaders).includes("idempotent-replayed");
  answers.push(`${r.statusCode} ${r.body}`);
  console.log(`invocation ${attempt}: ${r.statusCode} replayed=${replayed} ${r.body}`);
}
const record = {
  messageId: `m-${key}`,
  body: JSON.stringify({ account, amount_cents: 100 }),
  attributes: { ApproximateReceiveCount: "1" },
} as SQSRecord;
for (const delivery of [1, 2]) {
  const { batchItemFailures } = await credit({ Records: [record] }, context);
  console.log(`SQS delivery ${delivery}: batchItemFailures ${JSON.stringify(batchItemFailures)}`);
}
const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM payments WHERE account = $1", [
  account,
]);
console.log(`payments for the account: ${rows[0]?.n}`);
if (rows[0]?.n !== 2 || answers[0] !== answers[1]) process.exitCode = 1;
await db.close();
