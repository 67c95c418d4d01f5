/**
 * Issue 13's benchmark for encryption at rest: what sealing costs, in one run.
 *
 *   npx tsx --conditions=source bench/sealing.ts     (DATABASE_URL, default postgres://postgres@127.0.0.1:5432/test)
 *
 * 1. The sealer alone: µs per seal and per open of a 1 KB reply and of a small JSON input (AES-256-GCM,
 *    node:crypto); and the operation references every keyed answer carries, sealed (operation-ref.ts),
 *    against the readable base64 JSON they replaced, with this process's CPU per reference
 *    (docs/decisions/sealed-operation-refs.md).
 * 2. The atomic store on the real PostgreSQL, with and without a sealer, in alternating rounds in one
 *    database of its own: keyed first-time requests (claim, work, save a 1 KB reply) and keyed replays
 *    of the same keys, BENCH_SEALING_KEYS (default 3,000) keys per mode and round, 3 rounds, 16 at a
 *    time. Printed: requests/s of each, the sealed / clear ratio, and this process's CPU µs per request.
 */
import { randomBytes, randomUUID } from "node:crypto";
import {
  AesGcmSealer,
  type Claim,
  OperationRefs,
  openJson,
  type Sealer,
  type StoredResponse,
  sealJson,
} from "../src/core/index.ts";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../src/postgres/store.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";
import { load } from "./load.ts";

const KEYS = Number(process.env.BENCH_SEALING_KEYS ?? 3_000);
const ROUNDS = 3;
const CONCURRENCY = 16;
const MICRO_OPS = 20_000;

export interface SealingResult {
  micro: { sealUs: number; openUs: number; sealJsonUs: number; openJsonUs: number };
  refs: Record<"readable" | "sealed", { encodeUs: number; decodeUs: number; encodeCpuUs: number }>;
  store: Record<
    "clear" | "sealed",
    { firstRps: number; replayRps: number; firstCpuUs: number; replayCpuUs: number }
  >;
}

/** A 1 KB JSON reply. */
function reply(): StoredResponse {
  const id = `pay_${randomBytes(12).toString("hex")}`;
  const pad = "x".repeat(1024 - 120);
  const body = JSON.stringify({ id, amount_cents: 5000, currency: "eur", status: "succeeded", note: pad });
  return {
    status: 201,
    headers: [["content-type", "application/json"]],
    body: new TextEncoder().encode(body),
  };
}

/** µs per call of `fn`: the median of 7 rounds (the machine is shared, single rounds are noisy). */
function perOp(n: number, fn: (i: number) => void): number {
  for (let i = 0; i < 2000; i++) fn(i); // warm up
  const rounds: number[] = [];
  for (let r = 0; r < 7; r++) {
    const t = performance.now();
    for (let i = 0; i < n / 7; i++) fn(i);
    rounds.push(((performance.now() - t) * 1000 * 7) / n);
  }
  return rounds.sort((a, b) => a - b)[3]!;
}

function micro(sealer: Sealer): SealingResult["micro"] {
  const body = reply().body;
  const sealed = sealer.seal(body, "ctx");
  const input = { amount_cents: 5000, currency: "eur", card_token: "tok_4f1c2a9be0" };
  const stored = sealJson(sealer, input, "ctx");
  return {
    sealUs: perOp(MICRO_OPS, () => sealer.seal(body, "ctx")),
    openUs: perOp(MICRO_OPS, () => sealer.open(sealed, "ctx")),
    sealJsonUs: perOp(MICRO_OPS, () => sealJson(sealer, input, "ctx")),
    openJsonUs: perOp(MICRO_OPS, () => openJson(sealer, stored, "ctx")),
  };
}

/** The operation references of one claim: sealed, and the readable form they replaced. */
function refsMicro(): SealingResult["refs"] {
  const sealed = new OperationRefs([{ id: "db-0123456789ab", secret: randomBytes(32) }]);
  const readable = {
    encode: (scope: string, key: string, claim: string) =>
      `op_${Buffer.from(JSON.stringify([scope, key, claim])).toString("base64url")}`,
    decode: (ref: string) => JSON.parse(Buffer.from(ref.slice(3), "base64url").toString("utf8")),
  };
  const keys = Array.from({ length: 1000 }, () => randomUUID());
  const claim = "0190f5b2-7c1e-7a8e-9a51-3c2d1e0f9a7b";
  const out = {} as SealingResult["refs"];
  for (const [name, codec] of [
    ["readable", readable],
    ["sealed", sealed],
  ] as const) {
    const made = keys.map((k) => codec.encode("acct_demo_1", k, claim));
    const cpu = process.cpuUsage();
    const encodeUs = perOp(MICRO_OPS * 5, (i) => codec.encode("acct_demo_1", keys[i % 1000]!, claim));
    const used = process.cpuUsage(cpu);
    out[name] = {
      encodeUs,
      encodeCpuUs: (used.user + used.system) / (MICRO_OPS * 5 + 2000),
      decodeUs: perOp(MICRO_OPS * 5, (i) => codec.decode(made[i % 1000]!)),
    };
  }
  return out;
}

export async function sealingBench(): Promise<SealingResult> {
  const sealer = new AesGcmSealer([{ id: "k1", key: randomBytes(32) }]);
  const m = micro(sealer);
  const r = refsMicro();
  console.log("Operation references (one per keyed answer), per reference:");
  console.log("| form | encode µs | encode CPU µs | decode µs |\n|---|---:|---:|---:|");
  for (const [name, v] of Object.entries(r)) {
    console.log(
      `| ${name} | ${v.encodeUs.toFixed(2)} | ${v.encodeCpuUs.toFixed(2)} | ${v.decodeUs.toFixed(2)} |`,
    );
  }
  console.log(`sealed / readable encode time: ${(r.sealed.encodeUs / r.readable.encodeUs).toFixed(1)}`);
  console.log("Sealer alone (AES-256-GCM, node:crypto):");
  console.log("| value | seal µs | open µs |\n|---|---:|---:|");
  console.log(`| 1 KB reply body | ${m.sealUs.toFixed(2)} | ${m.openUs.toFixed(2)} |`);
  console.log(
    `| small JSON input (as a sealed:v1 string) | ${m.sealJsonUs.toFixed(2)} | ${m.openJsonUs.toFixed(2)} |`,
  );

  const fresh = await freshBenchDatabase();
  const pool = benchPool(fresh.url, { max: CONCURRENCY + 4, pipeline: true });
  const db = fromPg(pool);
  const sums = {
    clear: {
      first: [] as number[],
      replay: [] as number[],
      firstCpu: [] as number[],
      replayCpu: [] as number[],
    },
    sealed: {
      first: [] as number[],
      replay: [] as number[],
      firstCpu: [] as number[],
      replayCpu: [] as number[],
    },
  };
  try {
    await migrate(db);
    const stores = {
      clear: await PostgresStore.open(db),
      sealed: await PostgresStore.open(db, { sealer }),
    };
    for (let round = 0; round < ROUNDS; round++) {
      // Alternate which mode goes first, so neither always meets a warmer cache.
      const order = round % 2 === 0 ? (["clear", "sealed"] as const) : (["sealed", "clear"] as const);
      for (const mode of order) {
        const store = stores[mode];
        const claims: Claim[] = Array.from({ length: KEYS }, () => ({
          scope: `acct_${randomBytes(3).toString("hex")}`,
          key: randomUUID(),
          fingerprint: randomBytes(32),
        }));
        const first = await load(KEYS, CONCURRENCY, (i) =>
          store.atomic(claims[i]!, async () => {
            const r = reply();
            return { response: r, save: r };
          }),
        );
        const replay = await load(KEYS, CONCURRENCY, (i) =>
          store.atomic(claims[i]!, async () => {
            throw new Error("a replay ran the work");
          }),
        );
        sums[mode].first.push(first.rps);
        sums[mode].replay.push(replay.rps);
        sums[mode].firstCpu.push(first.cpuUs);
        sums[mode].replayCpu.push(replay.cpuUs);
      }
    }
  } finally {
    await db.close();
    await fresh.drop();
  }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  const store = {
    clear: {
      firstRps: median(sums.clear.first),
      replayRps: median(sums.clear.replay),
      firstCpuUs: median(sums.clear.firstCpu),
      replayCpuUs: median(sums.clear.replayCpu),
    },
    sealed: {
      firstRps: median(sums.sealed.first),
      replayRps: median(sums.sealed.replay),
      firstCpuUs: median(sums.sealed.firstCpu),
      replayCpuUs: median(sums.sealed.replayCpu),
    },
  };
  console.log(
    `\nAtomic store on PostgreSQL, 1 KB replies, ${KEYS} keys x ${ROUNDS} rounds per mode, ${CONCURRENCY} at a time (medians):`,
  );
  console.log("| store | first-time req/s | replay req/s | CPU µs/req first | CPU µs/req replay |");
  console.log("|---|---:|---:|---:|---:|");
  for (const mode of ["clear", "sealed"] as const) {
    const s = store[mode];
    console.log(
      `| ${mode === "clear" ? "in clear" : "sealed (AES-256-GCM)"} | ${s.firstRps.toFixed(0)} | ${s.replayRps.toFixed(0)} | ` +
        `${s.firstCpuUs.toFixed(0)} | ${s.replayCpuUs.toFixed(0)} |`,
    );
  }
  console.log(
    `sealed / clear: first-time ${(store.sealed.firstRps / store.clear.firstRps).toFixed(2)}, ` +
      `replay ${(store.sealed.replayRps / store.clear.replayRps).toFixed(2)}; ` +
      `CPU per request +${(store.sealed.firstCpuUs - store.clear.firstCpuUs).toFixed(0)} µs first-time, ` +
      `+${(store.sealed.replayCpuUs - store.clear.replayCpuUs).toFixed(0)} µs replay`,
  );
  return { micro: m, refs: r, store };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  await sealingBench();
}
