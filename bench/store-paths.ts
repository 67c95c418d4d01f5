/**
 * Issue 15's store-level paths, measured side by side: the same one-INSERT payment bare (no key,
 * autocommitted), and through `PostgresStore.atomic` first-time and replayed, and the replay read a
 * waiting duplicate makes first (no lock, no transaction). Interleaved rounds on a pipelining pg pool of
 * 10 with 16 workers; medians of the rounds, ratios to bare.
 *
 *   npx tsx --conditions=source bench/store-paths.ts   (DATABASE_URL; a database of its own, dropped)
 */
import { randomBytes, randomUUID } from "node:crypto";
import { pathToFileURL } from "node:url";
import type { Claim, StoredResponse } from "../src/core/index.ts";
import { type LookupRow, lookupQuery, lookupRowOf } from "../src/postgres/atomic/sql.ts";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { replayOf } from "../src/postgres/keys/row.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../src/postgres/store.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";
import { drive, f0, f2, type Slice } from "./scale-lib.ts";

const ROUNDS = Number(process.env.BENCH_PATHS_ROUNDS ?? 5);
const SLICE_MS = Number(process.env.BENCH_PATHS_SECONDS ?? 2) * 1000;
const enc = new TextEncoder();

export interface PathRow {
  name: string;
  slice: Slice;
  ratio: number;
}

export async function storePathsBench(): Promise<PathRow[]> {
  const fresh = await freshBenchDatabase();
  const db = fromPg(benchPool(fresh.url, { max: 10, pipeline: true }));
  try {
    await migrate(db);
    await db.exec(
      "CREATE TABLE payments (id bigserial PRIMARY KEY, account text NOT NULL, amount_cents int NOT NULL)",
    );
    const store = await PostgresStore.open(db);

    const insert = "INSERT INTO payments (account, amount_cents) VALUES ($1, $2) RETURNING id";
    const pay = async (q: { query: typeof db.query }) => {
      const { rows } = await q.query<{ id: string }>(insert, ["acct_1", 5000]);
      const response: StoredResponse = {
        status: 201,
        headers: [["content-type", "application/json"]],
        body: enc.encode(`{"id":"${rows[0]!.id}","amount_cents":5000}`),
      };
      return { response, save: response };
    };
    const claim = (): Claim => ({ scope: "acct_1", key: randomUUID(), fingerprint: randomBytes(32) });
    const stored: Claim[] = [];
    for (let i = 0; i < 2_000; i++) {
      const c = claim();
      await store.atomic(c, (tx) => pay(tx));
      stored.push(c);
    }
    const any = () => stored[Math.floor(Math.random() * stored.length)]!;
    const variants: [string, () => Promise<unknown>][] = [
      ["bare INSERT, autocommitted", () => pay(db)],
      ["first-time key: atomic()", () => store.atomic(claim(), (tx) => pay(tx))],
      ["replay: atomic() (lock + lookup in a transaction)", () => store.atomic(any(), (tx) => pay(tx))],
      [
        "replay read without lock or transaction (a waiting duplicate's first read)",
        async () => {
          const c = any();
          const q = lookupQuery(store, c.scope, c.key);
          const found = (await db.query<LookupRow>(q.text, q.params)).rows[0];
          if (!found || !replayOf(store, c, lookupRowOf(found))) throw new Error("no replay");
        },
      ],
    ];
    const slices = new Map<string, Slice[]>(variants.map(([n]) => [n, []]));
    for (let round = 0; round <= ROUNDS; round++) {
      for (const [name, op] of variants) {
        const s = await drive(round === 0 ? 500 : SLICE_MS, op);
        if (round > 0) slices.get(name)!.push(s);
      }
    }
    const median = (xs: Slice[]) => [...xs].sort((a, b) => a.rate - b.rate)[Math.floor(xs.length / 2)]!;
    const bare = median(slices.get(variants[0]![0])!).rate;
    const rows = variants.map(([name]) => {
      const m = median(slices.get(name)!);
      const rates = slices.get(name)!.map((s) => s.rate);
      console.log(
        `| ${name} | ${f0(m.rate)} (${f0(Math.min(...rates))}-${f0(Math.max(...rates))}) | ${f2(m.rate / bare)} | ${m.p50.toFixed(1)} / ${m.p99.toFixed(1)} |`,
      );
      return { name, slice: m, ratio: m.rate / bare };
    });
    return rows;
  } finally {
    await db.close();
    await fresh.drop();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  console.log(
    `| path (${ROUNDS} interleaved rounds) | per s, median (range) | / bare | p50 / p99 ms |\n|---|---:|---:|---:|`,
  );
  storePathsBench().then(
    () => process.exit(0),
    (err) => {
      console.error(err);
      process.exit(1);
    },
  );
}
