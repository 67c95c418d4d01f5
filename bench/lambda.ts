/**
 * Issue 62's benchmark: what idem/lambda adds to a Lambda function, beside Powertools' idempotency.
 *
 *   npm run bench -- --only lambda      (DATABASE_URL; redis-server for Powertools' cache layer)
 *
 * Cold start: a fresh Node process per run stands for a container's first invocation: the import of
 * what the function needs plus its pool, then the first event with a new key (bench/lambda-cold.mjs).
 * The bare handler (pg, one INSERT), idem/lambda (the INSERT in the key's transaction) and Powertools'
 * makeIdempotent on its cache persistence layer (a local redis-server; DynamoDB is remote in AWS) each
 * run BENCH_LAMBDA_COLD times (default 7), interleaved; medians.
 * Per invocation, in one warm process, invocations one at a time as Lambda gives them: the bare handler,
 * idem with a new key each time, and idem replaying one key; interleaved rounds; wall time and CPU of
 * this process per invocation, and the ratios to the bare handler.
 */
import { execFile, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import type { APIGatewayProxyEvent } from "aws-lambda";
import { idempotency } from "../src/lambda/index.ts";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../src/postgres/store.ts";
import { freeLoopbackPort } from "../test/helpers/ports.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";
import { restEvent } from "./lambda-event.mjs";

const run = promisify(execFile);
const ROOT = fileURLToPath(new URL("../", import.meta.url));
const COLD = Number(process.env.BENCH_LAMBDA_COLD ?? 7);
const WARM = Number(process.env.BENCH_LAMBDA_WARM ?? 2_000);
const ROUNDS = 4;
const INSERT = "INSERT INTO payments (account, amount_cents) VALUES ($1, $2) RETURNING id";

interface Cold {
  importMs: number;
  firstMs: number;
  rssMB: number;
  importRssMB: number;
  cpuMs: number;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const f1 = (n: number) => n.toFixed(1);

const context = { getRemainingTimeInMillis: () => 30_000 };

export async function lambdaBench(): Promise<Record<string, unknown>> {
  if (!existsSync(`${ROOT}dist/lambda/index.js`)) {
    console.log("building dist/ (the cold start loads idem as installed)");
    await run("npm", ["run", "build"], { cwd: ROOT });
  }
  const fresh = await freshBenchDatabase();
  const pool = benchPool(fresh.url, { max: 1 });
  const db = fromPg(pool);
  let redis: ReturnType<typeof spawn> | undefined;
  try {
    await migrate(db);
    await db.exec(
      "CREATE TABLE payments (id serial PRIMARY KEY, account text NOT NULL, amount_cents int NOT NULL)",
    );

    // --- cold start ---
    const redisPort = await freeLoopbackPort();
    const redisBin = process.env.REDIS_SERVER ?? "/usr/bin/redis-server";
    const modes = existsSync(redisBin)
      ? (["bare", "idem", "powertools"] as const)
      : (["bare", "idem"] as const);
    if (existsSync(redisBin)) {
      redis = spawn(redisBin, ["--port", String(redisPort), "--bind", "127.0.0.1", "--save", ""], {
        stdio: "ignore",
      });
      await new Promise((r) => setTimeout(r, 300));
    } else console.log(`Powertools' cold start not measured: no ${redisBin}`);
    const cold: Record<string, Cold[]> = { bare: [], idem: [], powertools: [] };
    for (let i = 0; i < COLD; i++) {
      for (const mode of modes) {
        const { stdout } = await run(
          process.execPath,
          [`${ROOT}bench/lambda-cold.mjs`, mode, fresh.url, `redis://127.0.0.1:${redisPort}`],
          { cwd: ROOT },
        );
        cold[mode]!.push(JSON.parse(stdout.trim().split("\n").pop()!) as Cold);
      }
    }
    const coldOf = (mode: string) => {
      const runs = cold[mode]!;
      return {
        importMs: median(runs.map((r) => r.importMs)),
        firstMs: median(runs.map((r) => r.firstMs)),
        rssMB: median(runs.map((r) => r.rssMB)),
        cpuMs: median(runs.map((r) => r.cpuMs)),
      };
    };
    const bareCold = coldOf("bare");
    console.log(
      `cold start (median of ${COLD} fresh processes; import + pool, then the first event with a new key):`,
    );
    for (const mode of modes) {
      const c = coldOf(mode);
      const added =
        mode === "bare"
          ? ""
          : `; adds ${f1(c.importMs + c.firstMs - bareCold.importMs - bareCold.firstMs)} ms, ${f1(c.rssMB - bareCold.rssMB)} MB, ${f1(c.cpuMs - bareCold.cpuMs)} ms CPU to the bare handler`;
      console.log(
        `  ${mode.padEnd(10)} import ${f1(c.importMs)} ms, first invocation ${f1(c.firstMs)} ms, RSS +${f1(c.rssMB)} MB, CPU ${f1(c.cpuMs)} ms${added}`,
      );
    }

    // --- per invocation, warm ---
    const store = await PostgresStore.open(db);
    const bare = async (e: APIGatewayProxyEvent) => {
      const { rows } = await pool.query(INSERT, ["acct", 5000]);
      return { statusCode: 201, body: JSON.stringify(rows[0]), e };
    };
    const keyed = idempotency<APIGatewayProxyEvent>(
      async (_e, { tx }) => {
        const { rows } = await tx.query<{ id: number }>(INSERT, ["acct", 5000]);
        return { statusCode: 201, body: JSON.stringify(rows[0]) };
      },
      { store, scope: () => "acct" },
    );
    const replayKey = randomUUID();
    await keyed(restEvent(replayKey), context);
    const kinds = {
      bare: () => bare(restEvent("none")),
      "keyed, first time": () => keyed(restEvent(randomUUID()), context),
      "keyed, replay": () => keyed(restEvent(replayKey), context),
    };
    const totals: Record<string, { ms: number; cpuUs: number; n: number }> = {};
    for (const name of Object.keys(kinds)) totals[name] = { ms: 0, cpuUs: 0, n: 0 };
    for (let round = 0; round < ROUNDS; round++) {
      for (const [name, fn] of Object.entries(kinds)) {
        const n = Math.ceil(WARM / ROUNDS);
        for (let i = 0; i < 50; i++) await fn(); // warm this kind's path after the others ran
        const c0 = process.cpuUsage();
        const t0 = performance.now();
        for (let i = 0; i < n; i++) await fn();
        const cpu = process.cpuUsage(c0);
        totals[name]!.ms += performance.now() - t0;
        totals[name]!.cpuUs += cpu.user + cpu.system;
        totals[name]!.n += n;
      }
    }
    const per = (name: string) => ({
      us: (totals[name]!.ms * 1000) / totals[name]!.n,
      cpuUs: totals[name]!.cpuUs / totals[name]!.n,
    });
    const b = per("bare");
    console.log(
      `per invocation (one at a time, ${WARM} each in ${ROUNDS} interleaved rounds; CPU of this process):`,
    );
    const warm: Record<string, { us: number; cpuUs: number }> = {};
    for (const name of Object.keys(kinds)) {
      const p = per(name);
      warm[name] = p;
      console.log(
        `  ${name.padEnd(18)} ${f1(p.us)} us, ${f1(1e6 / p.us)}/s, CPU ${f1(p.cpuUs)} us per invocation; throughput / bare ${(b.us / p.us).toFixed(2)}, CPU / bare ${(p.cpuUs / b.cpuUs).toFixed(2)}`,
      );
    }
    return { cold: Object.fromEntries(modes.map((m) => [m, coldOf(m)])), warm };
  } finally {
    redis?.kill();
    await pool.end().catch(() => {});
    await fresh.drop();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) await lambdaBench();
