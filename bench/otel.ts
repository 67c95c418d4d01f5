/**
 * Issue 32's overhead benchmark: what idem's OpenTelemetry instrumentation costs a keyed request, in
 * one run.
 *
 *   npm run bench -- --only otel     (DATABASE_URL, default postgres://postgres@127.0.0.1:5432/test)
 *
 * The lifecycle (the part every HTTP adapter runs: begin, claim, work, save) over the atomic store on
 * the real PostgreSQL, 16 at a time, BENCH_OTEL_KEYS (default 800) keys per mode and round, first-time
 * requests then replays of the same keys, in BENCH_OTEL_ROUNDS (default 10) interleaved rounds (the
 * order rotates each round):
 *
 *   off          no observer installed: the lifecycle as it was before the instrumentation
 *   no provider  @opentelemetry/api installed, nothing registered (the default for an app without an SDK)
 *   no-op        an SDK tracer provider that samples nothing (AlwaysOffSampler) and a meter provider
 *   sdk          the SDK recording every span: BatchSpanProcessor to an exporter that drops the batches,
 *                and a meter provider with a reader (what an instrumented service runs)
 *
 * Printed: the median requests/s of each mode and its ratio to "off", and this process's CPU µs per
 * request (what the instrumentation adds, less blurred by the other load of a shared machine).
 */
import { randomUUID } from "node:crypto";
import { context, metrics, propagation, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { MeterProvider, MetricReader } from "@opentelemetry/sdk-metrics";
import {
  AlwaysOffSampler,
  BatchSpanProcessor,
  type SpanExporter,
  TracerProvider,
} from "@opentelemetry/sdk-trace";
import { Lifecycle, type StoredResponse } from "../src/core/index.ts";
import { setLifecycleObserver } from "../src/core/observe.ts";
import { otel } from "../src/observability/otel.ts";
import { installServerTelemetry } from "../src/observability/server.ts";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../src/postgres/store.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";
import { load } from "./load.ts";

const KEYS = Number(process.env.BENCH_OTEL_KEYS ?? 800);
const ROUNDS = Number(process.env.BENCH_OTEL_ROUNDS ?? 10);
const CONCURRENCY = 16;
const ALL_MODES = ["off", "no provider", "no-op", "sdk"] as const;
type Mode = (typeof ALL_MODES)[number];
/** BENCH_OTEL_MODES="off,no provider" measures a subset (more rounds of it in the same time). */
const MODES = ALL_MODES.filter(
  (m) => m === "off" || !process.env.BENCH_OTEL_MODES || process.env.BENCH_OTEL_MODES.split(",").includes(m),
);

interface Row {
  firstRps: number;
  replayRps: number;
  firstRatio: number;
  replayRatio: number;
  firstCpuUs: number;
  replayCpuUs: number;
}

export interface OtelBenchResult {
  modes: Partial<Record<Mode, Row>>;
  spansExported: number;
}

class PullReader extends MetricReader {
  protected async onForceFlush(): Promise<void> {}
  protected async onShutdown(): Promise<void> {}
}

let exported = 0;
const dropping: SpanExporter = {
  export(spans, done) {
    exported += spans.length;
    done({ code: 0 });
  },
  async shutdown() {},
};

/** Put the process in `mode`; returns how to leave it. */
function enter(mode: Mode): () => Promise<void> {
  if (mode === "off") {
    setLifecycleObserver(undefined);
    return async () => installServerTelemetry();
  }
  installServerTelemetry();
  if (mode === "no provider") return async () => {};
  const contextManager = new AsyncLocalStorageContextManager().enable();
  context.setGlobalContextManager(contextManager);
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  const provider =
    mode === "no-op"
      ? new TracerProvider({ sampler: new AlwaysOffSampler() })
      : new TracerProvider({
          spanProcessors: [new BatchSpanProcessor({ exporter: dropping, maxQueueSize: 65_536 })],
        });
  trace.setGlobalTracerProvider(provider);
  const meters = new MeterProvider({ readers: [new PullReader()] });
  metrics.setGlobalMeterProvider(meters);
  return async () => {
    await provider.shutdown();
    await meters.shutdown();
    trace.disable();
    metrics.disable();
    propagation.disable();
    context.disable();
  };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

const REPLY: StoredResponse = {
  status: 201,
  headers: [["content-type", "application/json"]],
  body: new TextEncoder().encode('{"id":"pay_1","status":"succeeded"}'),
};
const BODY = new TextEncoder().encode('{"amount_cents":5000,"currency":"eur"}');

/** ns per call of the check every call site makes first, with the API installed and nothing registered. */
function checkNs(): number {
  const n = 2_000_000;
  let seen = 0;
  for (let i = 0; i < 100_000; i++) if (otel()) seen++;
  const t = performance.now();
  for (let i = 0; i < n; i++) if (otel()) seen++;
  const ns = ((performance.now() - t) * 1e6) / n;
  if (seen !== 0) throw new Error("a provider is registered");
  return ns;
}

export async function otelBench(): Promise<OtelBenchResult> {
  const ns = checkNs();
  console.log(
    `With @opentelemetry/api and nothing registered, each call site's check costs ${ns.toFixed(0)} ns (4 per keyed request).`,
  );
  const fresh = await freshBenchDatabase();
  const pool = benchPool(fresh.url, { max: CONCURRENCY + 4 });
  const db = fromPg(pool);
  type Runs = { first: number[]; replay: number[]; firstCpu: number[]; replayCpu: number[] };
  const runs = Object.fromEntries(
    MODES.map((m) => [m, { first: [], replay: [], firstCpu: [], replayCpu: [] }]),
  ) as unknown as Record<Mode, Runs>;
  try {
    await migrate(db);
    const store = await PostgresStore.open(db);
    const lifecycle = new Lifecycle({ store });
    const request = (key: string) => ({
      method: "POST",
      path: "/v1/payments",
      header: (name: string) =>
        name === "idempotency-key" ? key : name === "content-type" ? "application/json" : undefined,
    });
    const once = async (key: string) => {
      const begun = lifecycle.begin(request(key), "acct_bench", BODY);
      if (begun.kind !== "keyed") throw new Error(`not keyed: ${begun.kind}`);
      const settled = await lifecycle.keyed(begun, async () => REPLY);
      if (settled.response.status !== 201) throw new Error(`answered ${settled.response.status}`);
    };
    // Warm up (JIT, the pool, the partitions' caches).
    const warm = Array.from({ length: 500 }, () => randomUUID());
    await load(warm.length, CONCURRENCY, (i) => once(warm[i]!));
    await load(warm.length, CONCURRENCY, (i) => once(warm[i]!));
    for (let round = 0; round < ROUNDS; round++) {
      const order = MODES.map((_, i) => MODES[(i + round) % MODES.length]!);
      for (const mode of order) {
        const leave = enter(mode);
        const keys = Array.from({ length: KEYS }, () => randomUUID());
        const first = await load(KEYS, CONCURRENCY, (i) => once(keys[i]!));
        const replay = await load(KEYS, CONCURRENCY, (i) => once(keys[i]!));
        runs[mode].first.push(first.rps);
        runs[mode].firstCpu.push(first.cpuUs);
        runs[mode].replay.push(replay.rps);
        runs[mode].replayCpu.push(replay.cpuUs);
        await leave();
      }
    }
  } finally {
    await db.close();
    await fresh.drop();
  }
  const off = { first: median(runs.off.first), replay: median(runs.off.replay) };
  const modes = Object.fromEntries(
    MODES.map((m) => {
      const firstRps = median(runs[m].first);
      const replayRps = median(runs[m].replay);
      return [
        m,
        {
          firstRps,
          replayRps,
          firstRatio: firstRps / off.first,
          replayRatio: replayRps / off.replay,
          firstCpuUs: median(runs[m].firstCpu),
          replayCpuUs: median(runs[m].replayCpu),
        },
      ];
    }),
  ) as OtelBenchResult["modes"];
  console.log(
    `Keyed requests through the lifecycle, ${KEYS} keys per mode and round, ${ROUNDS} interleaved rounds, ${CONCURRENCY} at a time (medians; a shared 2-core machine):`,
  );
  console.log(
    "| mode | first-time req/s | vs off | CPU µs/req | replay req/s | vs off | CPU µs/req |\n|---|---:|---:|---:|---:|---:|---:|",
  );
  for (const m of MODES) {
    const r = modes[m]!;
    console.log(
      `| ${m} | ${r.firstRps.toFixed(0)} | ${r.firstRatio.toFixed(3)} | ${r.firstCpuUs.toFixed(0)} | ${r.replayRps.toFixed(0)} | ${r.replayRatio.toFixed(3)} | ${r.replayCpuUs.toFixed(0)} |`,
    );
  }
  console.log(`Spans exported by the SDK mode: ${exported}`);
  return { modes, spansExported: exported };
}

if (import.meta.url === `file://${process.argv[1]}`) await otelBench();
