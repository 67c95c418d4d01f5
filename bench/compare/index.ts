/**
 * What users compare: the same one-INSERT payment handler bare (no middleware, autocommitted), with
 * idem on each adapter (atomic mode, pg pipeline driver), and with the peers users pick (on Redis).
 * Every variant is a server in a child process; wrk, in another process, loads one of them at a time in
 * short slices: per keyed variant, the bare handler of its framework, keyed first-time, replay and one hot key in
 * adjacent slices, over several rounds, so that drift on a shared machine reaches all of them alike.
 * Ratios are to the adjacent bare slice. Then the correctness columns: 50 requests at once with one key (executions counted in the
 * table) and a crash right after the INSERT (kill -9, restart, retry the key).
 *
 *   npm run bench -- --only compare [--quick]
 *
 * Needs PostgreSQL (DATABASE_URL; a database of its own, dropped after), Redis (REDIS_URL, default
 * redis://127.0.0.1:6379) and wrk (`apt-get install -y wrk`). idem runs from its built package (the
 * bench builds dist/ first; BENCH_SOURCE=1 runs the sources). Full: 15 s of warm-up per server, then 4
 * rounds of 2 s slices, about 15 minutes on the 2-core machine; --quick: no warm-up, one round of 1 s
 * slices, about a minute. BENCH_COMPARE_WARMUP_S, BENCH_COMPARE_ROUNDS and BENCH_COMPARE_SLICE_S
 * override the three.
 */
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { fromPg, migrate } from "idem/postgres";
import pg from "pg";
import { freshBenchDatabase } from "../http.ts";
import {
  type Crash,
  crashAndRetry,
  crashVerdict,
  type SameKey,
  sameKeyAtOnce,
  sameKeyVerdict,
} from "./correctness.ts";
import { backendsCpu, backendsDelta, findProcess, processCpuUs } from "./cpu.ts";
import { PAYMENTS_DDL } from "./handler.ts";
import { checkRedis, REDIS_URL, redisCleanup } from "./redis.ts";
import { send } from "./requests.ts";
import { FROM_SOURCE, type RunningServer, startServer } from "./spawn.ts";
import { bareOf, chosenVariants, type Framework, handTxOf, POOL_SIZE, type Variant } from "./variants.ts";
import { checkWrk, type Mode, wrk } from "./wrk.ts";

const BASE = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";

export interface CompareSettings {
  quick: boolean;
  rounds: number;
  sliceSeconds: number;
  connections: number;
  poolSize: number;
  replayKeys: number;
  /** Keys sent 50 times at once each. */
  sameKeys: number;
  /** How long the crash check retries a key before calling it stuck. */
  crashWindowSeconds: number;
  /** Load on each server before the rounds (the replay path gets a fifth of it more). */
  warmupSeconds: number;
  /** idem's code as run by the servers: the built package, or the sources through tsx (BENCH_SOURCE=1). */
  idemFrom: "dist" | "source";
}

/** One variant in one mode, over all rounds. */
export interface ModeStats {
  /** Median over the rounds, and the lowest and highest round. */
  rps: number;
  rpsMin: number;
  rpsMax: number;
  /** Medians over the rounds. */
  p50Ms: number;
  p99Ms: number;
  /** CPU per request: the server's process, this database's PostgreSQL backends, the Redis server. */
  nodeUs: number;
  postgresUs: number;
  redisUs: number;
  requests: number;
  /** Connection errors, timeouts and 4xx/5xx answers. */
  errors: number;
}

/** CPU per request, µs: the server's process and this database's PostgreSQL backends. */
export interface PairCpu {
  nodeUs: number;
  postgresUs: number;
}

export interface Ratio {
  /** Median of the per-round ratios, and the lowest and highest. */
  median: number;
  min: number;
  max: number;
}

export interface CompareRow {
  name: string;
  label: string;
  short: string;
  kind: Variant["kind"];
  framework: Framework;
  modes: Partial<Record<Mode, ModeStats>>;
  keyedRatio?: Ratio;
  replayRatio?: Ratio;
  /** Replays of one hot key (every connection the same finished key) over bare. */
  hotRatio?: Ratio;
  /**
   * idem's keyed first-time over the hand-written variant's (`yardstick`: hand-tx on the same framework,
   * hand-cte for single-statement mode), in the slice beside it.
   */
  handRatio?: Ratio;
  /** The hand-written variant of handRatio. */
  yardstick?: string;
  /**
   * CPU per keyed request over the slices of handRatio's pairs (weighted by their requests): idem's and
   * the yardstick's, node and PostgreSQL. On a shared machine the steadier of the two figures.
   */
  handCpu?: { idem: PairCpu; hand: PairCpu };
  sameKey?: SameKey;
  sameKeyVerdict?: string;
  crash?: Crash;
  crashVerdict?: string;
}

export interface Comparison {
  settings: CompareSettings;
  rows: CompareRow[];
  seconds: number;
}

interface Sample {
  round: number;
  rps: number;
  requests: number;
  errors: number;
  p50Ms: number;
  p99Ms: number;
  nodeUs: number;
  postgresUs: number;
  redisUs: number;
}

/** The median (the mean of the middle two for an even count). */
export const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[s.length >> 1]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

function settingsFor(quick: boolean): CompareSettings {
  return {
    quick,
    rounds: Number(process.env.BENCH_COMPARE_ROUNDS ?? (quick ? 1 : 4)),
    sliceSeconds: Number(process.env.BENCH_COMPARE_SLICE_S ?? (quick ? 1 : 2)),
    connections: 32,
    poolSize: POOL_SIZE,
    replayKeys: quick ? 32 : 256,
    sameKeys: quick ? 5 : 20,
    crashWindowSeconds: quick ? 3 : 12,
    warmupSeconds: Number(process.env.BENCH_COMPARE_WARMUP_S ?? (quick ? 0 : 15)),
    idemFrom: FROM_SOURCE ? "source" : "dist",
  };
}

/** Every server started here, killed if the process ends before they were stopped. */
const started = new Set<RunningServer>();
process.on("exit", () => {
  for (const s of started) s.child.kill("SIGKILL");
});

async function start(name: string, env: Record<string, string>): Promise<RunningServer> {
  const s = await startServer(name, env);
  started.add(s);
  void s.exited.then(() => started.delete(s));
  return s;
}

export async function compareBench(options: { quick?: boolean } = {}): Promise<Comparison> {
  const t0 = performance.now();
  const settings = settingsFor(options.quick ?? false);
  const variants = chosenVariants();
  await checkWrk();
  await checkRedis();
  if (!FROM_SOURCE) {
    // The servers import idem's built package: build it from the sources of this checkout.
    execFileSync("npm", ["run", "--silent", "build"], { stdio: ["ignore", "ignore", "inherit"] });
    console.log(`  idem built (dist/) (${((performance.now() - t0) / 1000).toFixed(0)} s)`);
  }
  const run = randomUUID().slice(0, 8);
  const db = await freshBenchDatabase();
  const dbName = new URL(db.url).pathname.slice(1);
  // Counts executions for checks that run side by side: a small pool.
  const benchDb = new pg.Pool({ connectionString: db.url, max: 4 });
  benchDb.on("error", () => {});
  const admin = new pg.Client({ connectionString: BASE }); // outside the bench database: not counted
  const servers = new Map<string, RunningServer>();
  try {
    await admin.connect();
    await benchDb.query(PAYMENTS_DDL);
    const pool = new pg.Pool({ connectionString: db.url, max: 1 });
    await migrate(fromPg(pool));
    await pool.end();

    const env = { DATABASE_URL: db.url, REDIS_URL, BENCH_RUN: run, NODE_ENV: "production" };
    for (const s of await Promise.all(variants.map((v) => start(v.name, env)))) servers.set(s.name, s);
    const since = () => `${((performance.now() - t0) / 1000).toFixed(0)} s`;
    console.log(`  ${servers.size} servers listening (${since()})`);
    const redisPid = findProcess("redis-server");
    const keyed = variants.filter((v) => v.kind !== "bare");
    const replayPrefix = (v: Variant) => `${run}-${v.name}-r`;

    // Warm-up (JIT, connections, plan caches), then the keys the replay slices replay.
    for (const v of variants) {
      const url = servers.get(v.name)!.url;
      const prefix = `${run}-${v.name}-warm`;
      if (settings.quick) {
        await send(
          url,
          Array.from({ length: 50 }, (_, i) => (v.kind === "bare" ? undefined : `${prefix}-${i}`)),
          16,
        );
      } else {
        // Until the server runs at its steady pace: on this machine idem's keyed path took about 15 s
        // of load to get there (2,600 -> 4,200 req/s, V8 optimising and PostgreSQL's CPU per request falling with it;
        // the bare handlers about 5 s), and a slice of a colder server measures the warm-up instead.
        const mode = v.kind === "bare" ? "bare" : "keyed";
        await wrk(url, {
          mode,
          prefix,
          replayKeys: 1,
          seconds: settings.warmupSeconds,
          connections: settings.connections,
        });
      }
    }
    for (const v of keyed) {
      const keys = Array.from({ length: settings.replayKeys }, (_, i) => `${replayPrefix(v)}-${i}`);
      const url = servers.get(v.name)!.url;
      const ok = await send(url, keys, 16);
      if (ok < keys.length)
        throw new Error(`${v.name}: ${keys.length - ok} of the replay keys were not answered 2xx`);
      if (!settings.quick) {
        const seconds = Math.max(1, Math.round(settings.warmupSeconds / 5));
        await wrk(url, {
          mode: "replay",
          prefix: replayPrefix(v),
          replayKeys: settings.replayKeys,
          seconds,
          connections: settings.connections,
        });
      }
    }

    console.log(`  warmed up, replay keys stored (${since()})`);
    // One slice: some requests first (the pools close idle connections while the other variants
    // run), then wrk, with the CPU of the server, of this database's backends and of Redis around it.
    const samples = new Map<string, Sample[]>(); // `${name}/${mode}`
    let slice = 0;
    const measure = async (v: Variant, mode: Mode, round: number): Promise<Sample> => {
      const server = servers.get(v.name)!;
      const replaying = mode === "replay" || mode === "hot";
      // A slice of its own for every keyed slice: hand-tx runs one beside each idem variant's per round.
      const prefix = replaying ? replayPrefix(v) : `${run}-${v.name}-k${round}-${slice++}`;
      const pre = (i: number) =>
        mode === "bare"
          ? undefined
          : mode === "hot"
            ? `${prefix}-0`
            : mode === "replay"
              ? `${prefix}-${i}`
              : `${prefix}-pre-${i}`;
      // Eight per pooled connection: each one (new when the pool closed it while other variants ran)
      // passes PostgreSQL's five custom plans per prepared statement before the slice is measured.
      await send(
        server.url,
        Array.from({ length: POOL_SIZE * 8 }, (_, i) => pre(i)),
        POOL_SIZE,
      );
      const node0 = processCpuUs(server.pid);
      const pg0 = await backendsCpu(admin, dbName);
      const redis0 = redisPid ? processCpuUs(redisPid) : 0;
      const w = await wrk(server.url, {
        mode,
        prefix,
        replayKeys: settings.replayKeys,
        seconds: settings.sliceSeconds,
        connections: settings.connections,
      });
      const pgUs = backendsDelta(pg0, await backendsCpu(admin, dbName));
      const n = Math.max(1, w.requests);
      const sample: Sample = {
        round,
        rps: w.requests / w.seconds,
        requests: w.requests,
        errors: w.errors,
        p50Ms: w.p50Ms,
        p99Ms: w.p99Ms,
        nodeUs: (processCpuUs(server.pid) - node0) / n,
        postgresUs: pgUs / n,
        redisUs: redisPid ? (processCpuUs(redisPid) - redis0) / n : 0,
      };
      const k = `${v.name}/${mode}`;
      samples.set(k, [...(samples.get(k) ?? []), sample]);
      console.log(
        `  round ${round + 1}/${settings.rounds} ${v.name.padEnd(20)} ${mode.padEnd(6)} ${sample.rps.toFixed(0).padStart(6)} req/s` +
          `  node ${sample.nodeUs.toFixed(0).padStart(4)} + pg ${sample.postgresUs.toFixed(0).padStart(4)} µs/req` +
          (w.errors ? ` (${w.errors} errors)` : ""),
      );
      return sample;
    };

    // The rounds: for each keyed variant, its framework's bare handler, keyed first-time, replay and one
    // hot key in adjacent slices (reversed every other round; the variants' order rotates), so each ratio
    // compares slices a few seconds apart even when the machine's load drifts. An idem variant's keyed
    // slice also has a keyed slice of hand-tx on its framework beside it (before it in one round, after
    // it in the next): keyed / hand-tx is that pair's ratio. Compared with hand-tx's own slice of the
    // round, up to a minute away, two identical runs on this machine gave idem/node 1.15 and 0.71.
    const ratios = new Map<
      string,
      { keyed: number[]; replay: number[]; hot: number[]; hand: number[]; pairs: [Sample, Sample][] }
    >(keyed.map((v) => [v.name, { keyed: [], replay: [], hot: [], hand: [], pairs: [] }]));
    type Step = { v: Variant; mode: Mode; as: Mode | "hand" };
    for (let round = 0; round < settings.rounds; round++) {
      const shift = (round * 3) % keyed.length;
      for (const v of [...keyed.slice(shift), ...keyed.slice(0, shift)]) {
        const hand = v.kind === "idem" ? handTxOf(v, variants) : undefined;
        const steps: Step[] = [
          { v: bareOf(v), mode: "bare", as: "bare" },
          ...(hand ? [{ v: hand, mode: "keyed" as Mode, as: "hand" as const }] : []),
          { v, mode: "keyed", as: "keyed" },
          { v, mode: "replay", as: "replay" },
          { v, mode: "hot", as: "hot" },
        ];
        if (round % 2 === 1) steps.reverse();
        const got: Partial<Record<Mode | "hand", Sample>> = {};
        for (const step of steps) got[step.as] = await measure(step.v, step.mode, round);
        const r = ratios.get(v.name)!;
        r.keyed.push(got.keyed!.rps / got.bare!.rps);
        r.replay.push(got.replay!.rps / got.bare!.rps);
        r.hot.push(got.hot!.rps / got.bare!.rps);
        if (got.hand) {
          r.hand.push(got.keyed!.rps / got.hand.rps);
          r.pairs.push([got.keyed!, got.hand]);
        }
      }
    }

    const rows: CompareRow[] = variants.map((v) => {
      const row: CompareRow = {
        name: v.name,
        label: v.label,
        short: v.short,
        kind: v.kind,
        framework: v.framework,
        modes: {},
      };
      for (const mode of ["bare", "keyed", "replay", "hot"] as Mode[]) {
        const s = samples.get(`${v.name}/${mode}`);
        if (s) row.modes[mode] = stats(s);
      }
      const r = ratios.get(v.name);
      if (r) {
        row.keyedRatio = spread(r.keyed);
        row.replayRatio = spread(r.replay);
        row.hotRatio = spread(r.hot);
      }
      // Keyed first-time over the hand-tx keyed slice beside it (issue 30's yardstick).
      if (r?.hand.length) {
        row.handRatio = spread(r.hand);
        row.yardstick = handTxOf(v, variants)?.name;
        row.handCpu = { idem: pairCpu(r.pairs.map((p) => p[0])), hand: pairCpu(r.pairs.map((p) => p[1])) };
      }
      return row;
    });

    console.log(`  rounds done (${since()})`);
    // Correctness: 50 at once per key, on the servers above (idem's variants and the peers, and the bare
    // Express handler to show that the check can fail).
    // (The hand-written variants are yardsticks of cost: they are not checked.)
    const checked = variants.filter(
      (v) => v.kind === "idem" || v.kind === "peer" || v.name === "bare-express",
    );
    // The instances that take over after the crashes below start meanwhile.
    const replacing = Promise.all(checked.map((v) => start(v.name, env)));
    replacing.catch(() => {});
    // Four variants at a time (pools of 10 each: max_connections is shared).
    for (let i = 0; i < checked.length; i += 4) {
      await Promise.all(
        checked.slice(i, i + 4).map(async (v) => {
          const r = await sameKeyAtOnce(
            servers.get(v.name)!.url,
            benchDb,
            `${run}-${v.name}-same`,
            settings.sameKeys,
          );
          const row = rows.find((x) => x.name === v.name)!;
          row.sameKey = r;
          row.sameKeyVerdict = sameKeyVerdict(r);
          console.log(`  50 at once: ${v.name.padEnd(20)} ${row.sameKeyVerdict}`);
        }),
      );
    }
    console.log(`  50 at once checked (${since()})`);
    // Crash: each checked server killed right after its INSERT, the key retried on a new instance.
    const replacements = await replacing;
    const crashes = await Promise.all(
      checked.map((v, i) =>
        crashAndRetry(
          servers.get(v.name)!,
          replacements[i]!,
          benchDb,
          `${run}-${v.name}`,
          settings.crashWindowSeconds * 1000,
        ).catch((err: Error) => err),
      ),
    );
    servers.clear();
    checked.forEach((v, i) => {
      const row = rows.find((x) => x.name === v.name)!;
      const c = crashes[i]!;
      if (c instanceof Error) row.crashVerdict = `not measured: ${c.message}`;
      else {
        row.crash = c;
        row.crashVerdict = crashVerdict(c, v.stuckUntil);
      }
      console.log(`  crash:      ${v.name.padEnd(20)} ${row.crashVerdict}`);
    });
    return { settings, rows, seconds: (performance.now() - t0) / 1000 };
  } finally {
    await Promise.all([...servers.values()].map((s) => s.stop()));
    await benchDb.end().catch(() => {});
    await admin.end().catch(() => {});
    await db.drop().catch(() => {});
    await redisCleanup(run).catch(() => {});
  }
}

function stats(s: Sample[]): ModeStats {
  const requests = s.reduce((n, x) => n + x.requests, 0);
  const perRequest = (f: (x: Sample) => number) =>
    s.reduce((n, x) => n + f(x) * x.requests, 0) / Math.max(1, requests);
  const rps = s.map((x) => x.rps);
  return {
    rps: median(rps),
    rpsMin: Math.min(...rps),
    rpsMax: Math.max(...rps),
    p50Ms: median(s.map((x) => x.p50Ms)),
    p99Ms: median(s.map((x) => x.p99Ms)),
    nodeUs: perRequest((x) => x.nodeUs),
    postgresUs: perRequest((x) => x.postgresUs),
    redisUs: perRequest((x) => x.redisUs),
    requests,
    errors: s.reduce((n, x) => n + x.errors, 0),
  };
}

function pairCpu(s: Sample[]): PairCpu {
  const requests = Math.max(
    1,
    s.reduce((n, x) => n + x.requests, 0),
  );
  return {
    nodeUs: s.reduce((n, x) => n + x.nodeUs * x.requests, 0) / requests,
    postgresUs: s.reduce((n, x) => n + x.postgresUs * x.requests, 0) / requests,
  };
}

function spread(rs: number[]): Ratio {
  return { median: median(rs), min: Math.min(...rs), max: Math.max(...rs) };
}
