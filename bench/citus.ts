/**
 * `node --conditions=source --import tsx bench/citus.ts`: keyed throughput of atomic mode on a Citus
 * cluster (coordinator + 2 workers on loopback, test/infra/citus.ts) against one plain PostgreSQL
 * node (DATABASE_URL), measured in the same run, rounds interleaved; and what one single-shard keyed
 * transaction costs (sequential latency, p50/p99). Every node of the cluster runs on this same
 * machine, so the figures show the cost of Citus's extra hop, not the capacity of more machines.
 * Also a row of `npm run bench` (`--only citus`), skipped with a message when Citus is not installed.
 */
import { randomUUID } from "node:crypto";
import { pathToFileURL } from "node:url";
import type { Db } from "../src/postgres/db.ts";
import { openDatabaseUrl } from "../src/postgres/drivers/connect.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../src/postgres/store.ts";
import { paymentClaim } from "../test/helpers/claim.ts";
import { freshDatabase } from "../test/helpers/db.ts";
import { citusUnavailable, startCitus } from "../test/infra/citus.ts";

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 5);
const CONCURRENCY = 16;
const TENANTS = 64;
const enc = new TextEncoder();

async function setUp(db: Db, citus: boolean): Promise<PostgresStore> {
  await migrate(db);
  await db.exec(
    "CREATE TABLE effects (scope text NOT NULL, id bigserial, amount integer NOT NULL, PRIMARY KEY (scope, id))",
  );
  if (citus)
    await db.query("SELECT create_distributed_table('effects', 'scope', colocate_with => 'idem.keys')");
  return PostgresStore.open(db);
}

function request(store: PostgresStore, i: number) {
  const scope = `acct_${i % TENANTS}`;
  return store.atomic(paymentClaim(scope, randomUUID(), "{}"), async (tx) => {
    const { rows } = await tx.query<{ id: string }>(
      "INSERT INTO effects (scope, amount) VALUES ($1, 100) RETURNING id::text AS id",
      [scope],
    );
    const response = { status: 201, headers: [], body: enc.encode(rows[0]!.id) };
    return { response, save: response };
  });
}

async function throughput(store: PostgresStore): Promise<number> {
  const end = performance.now() + SECONDS * 1000;
  let done = 0;
  let i = 0;
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (performance.now() < end) {
        await request(store, i++);
        done++;
      }
    }),
  );
  return done / SECONDS;
}

async function latency(store: PostgresStore, n = 200): Promise<{ p50: number; p99: number }> {
  const ms: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await request(store, i);
    ms.push(performance.now() - t);
  }
  ms.sort((a, b) => a - b);
  return { p50: ms[Math.floor(n * 0.5)]!, p99: ms[Math.floor(n * 0.99)]! };
}

export interface CitusRound {
  round: number;
  plain: number;
  citus: number;
}

export interface CitusResult {
  rounds: CitusRound[];
  /** Mean req/s over the rounds. */
  plain: number;
  citus: number;
  latency: Record<"plain" | "citus", { p50: number; p99: number }>;
}

/** Why Citus cannot run here, or undefined. */
export function citusMissing(): string | undefined {
  try {
    return citusUnavailable();
  } catch (err) {
    return (err as Error).message;
  }
}

/** The benchmark; resolves with `skipped` (and prints why) when Citus is not installed. */
export async function citusBench(): Promise<CitusResult | { skipped: string }> {
  const why = citusMissing();
  if (why) {
    console.log(`skipped: ${why}`);
    return { skipped: why };
  }
  const cluster = await startCitus();
  const cleanup: (() => Promise<void>)[] = [() => cluster.stop()];
  try {
    const cdb = await cluster.database("idem_bench_citus");
    cleanup.unshift(() => cdb.drop());
    const plainDb = await freshDatabase("bench_plain");
    cleanup.unshift(() => plainDb.drop());
    const citusOpen = await openDatabaseUrl(cdb.url("coordinator"));
    cleanup.unshift(() => citusOpen.db.close());
    const plainOpen = await openDatabaseUrl(plainDb.url);
    cleanup.unshift(() => plainOpen.db.close());
    const stores = { plain: await setUp(plainOpen.db, false), citus: await setUp(citusOpen.db, true) };
    const rows: CitusRound[] = [];
    for (let r = 1; r <= ROUNDS; r++) {
      const plain = await throughput(stores.plain);
      const citus = await throughput(stores.citus);
      rows.push({ round: r, plain, citus });
      console.log(
        `round ${r}: plain ${plain.toFixed(0)} req/s, citus ${citus.toFixed(0)} req/s (${(citus / plain).toFixed(2)}x)`,
      );
    }
    const sum = (k: "plain" | "citus") => rows.reduce((a, x) => a + x[k], 0) / rows.length;
    console.log(
      `keyed throughput, ${CONCURRENCY} concurrent, ${TENANTS} tenants: plain ${sum("plain").toFixed(0)} req/s, Citus coordinator ${sum("citus").toFixed(0)} req/s, ratio ${(sum("citus") / sum("plain")).toFixed(2)}`,
    );
    const lp = await latency(stores.plain);
    const lc = await latency(stores.citus);
    console.log(
      `one keyed single-shard transaction, sequential: plain p50 ${lp.p50.toFixed(2)} ms p99 ${lp.p99.toFixed(2)} ms; Citus p50 ${lc.p50.toFixed(2)} ms p99 ${lc.p99.toFixed(2)} ms`,
    );
    return { rounds: rows, plain: sum("plain"), citus: sum("citus"), latency: { plain: lp, citus: lc } };
  } finally {
    for (const step of cleanup) await step().catch((e) => console.error(e));
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  citusBench().catch((err) => {
    console.error(err);
    process.exitCode = 1;
  });
}
