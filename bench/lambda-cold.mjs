// One Lambda container's first invocation, in a fresh Node process (bench/lambda.ts runs it): the
// import of what the function needs, the pool, then the first event with a new key. Prints one JSON
// line: ms for the import and for the first invocation, the RSS they added (MB) and the CPU (ms).
//   node bench/lambda-cold.mjs bare|idem|powertools <database url> [redis url]
// idem is loaded from dist/ (the package as installed): `npm run build` first.
import { restEvent } from "./lambda-event.mjs";

const [mode, dbUrl, redisUrl] = process.argv.slice(2);
const rss0 = process.memoryUsage().rss;
const cpu0 = process.cpuUsage();
const t0 = performance.now();
const { default: pg } = await import("pg");
let handler;
const pool = new pg.Pool({ connectionString: dbUrl, max: 1 });
const insert = "INSERT INTO payments (account, amount_cents) VALUES ($1, $2) RETURNING id";
if (mode === "bare") {
  handler = async (e) => {
    const { rows } = await pool.query(insert, ["acct", JSON.parse(e.body).amount_cents]);
    return { statusCode: 201, body: JSON.stringify(rows[0]) };
  };
} else if (mode === "idem") {
  const { idempotency } = await import("../dist/lambda/index.js");
  const { fromPg, PostgresStore } = await import("../dist/postgres/index.js");
  const store = PostgresStore.open(fromPg(pool));
  let wrapped;
  handler = async (e, c) => {
    wrapped ??= idempotency(
      async (_e, { tx, body }) => {
        const { rows } = await tx.query(insert, ["acct", body.amount_cents]);
        return { statusCode: 201, body: JSON.stringify(rows[0]) };
      },
      { store: await store, scope: () => "acct" },
    );
    return wrapped(e, c);
  };
} else {
  const { makeIdempotent, IdempotencyConfig } = await import("@aws-lambda-powertools/idempotency");
  const { CachePersistenceLayer } = await import("@aws-lambda-powertools/idempotency/cache");
  const { createClient } = await import("@redis/client");
  const client = createClient({ url: redisUrl });
  const connected = client.connect();
  handler = makeIdempotent(
    async (e) => {
      await connected;
      const { rows } = await pool.query(insert, ["acct", JSON.parse(e.body).amount_cents]);
      return { statusCode: 201, body: JSON.stringify(rows[0]) };
    },
    {
      persistenceStore: new CachePersistenceLayer({ client }),
      config: new IdempotencyConfig({ eventKeyJmesPath: 'headers."idempotency-key"' }),
    },
  );
  await connected;
}
const t1 = performance.now();
const rss1 = process.memoryUsage().rss;
const context = { getRemainingTimeInMillis: () => 30_000, functionName: "bench", awsRequestId: "1" };
const result = await handler(restEvent(`k-${Math.random()}`), context);
if (result.statusCode !== 201) throw new Error(`first invocation answered ${result.statusCode}`);
const t2 = performance.now();
const cpu = process.cpuUsage(cpu0);
console.log(
  JSON.stringify({
    importMs: t1 - t0,
    firstMs: t2 - t1,
    rssMB: (process.memoryUsage().rss - rss0) / 2 ** 20,
    importRssMB: (rss1 - rss0) / 2 ** 20,
    cpuMs: (cpu.user + cpu.system) / 1000,
  }),
);
process.exit(0);
