/**
 * What named prepared statements are worth: the same store paths (a first-time key with a one-INSERT
 * payment, a replay through `atomic`, and the replay read without a lock) through node-postgres and
 * postgres.js, each with named statements (what a direct connection uses) and unnamed ones (what a
 * transaction pooler such as PgBouncer needs). Interleaved rounds in one run, one database; medians of
 * the rounds, ratios unnamed / named per driver.
 *
 *   npx tsx --conditions=source bench/prepared.ts   (DATABASE_URL; a database of its own, dropped)
 */
import { randomBytes, randomUUID } from "node:crypto";
import { pathToFileURL } from "node:url";
import postgres from "postgres";
import type { Claim, StoredResponse } from "../src/core/index.ts";
import { type LookupRow, lookupQuery, lookupRowOf } from "../src/postgres/atomic/sql.ts";
import type { Db } from "../src/postgres/db.ts";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { fromPostgresJs } from "../src/postgres/drivers/postgres-js.ts";
import { replayOf } from "../src/postgres/keys/row.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../src/postgres/store.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";
import { drive, f0, f2, type Slice } from "./scale-lib.ts";

const ROUNDS = Number(process.env.BENCH_PREPARED_ROUNDS ?? 5);
const SLICE_MS = Number(process.env.BENCH_PREPARED_SECONDS ?? 2) * 1000;
const enc = new TextEncoder();

export interface PreparedRow {
  driver: "pg" | "postgres";
  path: string;
  named: Slice;
  unnamed: Slice;
  /** unnamed / named throughput (median of rounds). */
  ratio: number;
}

export async function preparedBench(): Promise<PreparedRow[]> {
  const fresh = await freshBenchDatabase();
  const dbs: Record<string, Db> = {
    "pg named": fromPg(benchPool(fresh.url, { max: 10, pipeline: true }), { prepare: true }),
    "pg unnamed": fromPg(benchPool(fresh.url, { max: 10, pipeline: true }), { prepare: false }),
    "postgres named": fromPostgresJs(postgres(fresh.url, { max: 10, onnotice: () => {} }), {
      prepare: true,
    }),
    "postgres unnamed": fromPostgresJs(postgres(fresh.url, { max: 10, onnotice: () => {} }), {
      prepare: false,
    }),
  };
  try {
    const first = Object.values(dbs)[0]!;
    await migrate(first);
    await first.exec(
      "CREATE TABLE payments (id bigserial PRIMARY KEY, account text NOT NULL, amount_cents int NOT NULL)",
    );
    const insert = "INSERT INTO payments (account, amount_cents) VALUES ($1, $2) RETURNING id";
    const pay = async (q: { query: Db["query"] }) => {
      const { rows } = await q.query<{ id: string }>(insert, ["acct_1", 5000]);
      const response: StoredResponse = {
        status: 201,
        headers: [["content-type", "application/json"]],
        body: enc.encode(`{"id":"${rows[0]!.id}","amount_cents":5000}`),
      };
      return { response, save: response };
    };
    const claim = (): Claim => ({ scope: "acct_1", key: randomUUID(), fingerprint: randomBytes(32) });
    const stores: Record<string, PostgresStore> = {};
    for (const [name, db] of Object.entries(dbs)) stores[name] = await PostgresStore.open(db);
    const stored: Claim[] = [];
    for (let i = 0; i < 2_000; i++) {
      const c = claim();
      await stores["pg named"]!.atomic(c, (tx) => pay(tx));
      stored.push(c);
    }
    const any = () => stored[Math.floor(Math.random() * stored.length)]!;
    const paths: [string, (store: PostgresStore, db: Db) => Promise<unknown>][] = [
      ["first-time key: atomic()", (store) => store.atomic(claim(), (tx) => pay(tx))],
      [
        "replay: atomic() (a finished key: its lock-free read)",
        (store) => store.atomic({ ...any() }, (tx) => pay(tx)),
      ],
      [
        "replay read without lock or transaction",
        async (store, db) => {
          const c = any();
          const q = lookupQuery(store, c.scope, c.key);
          const found = (await db.query<LookupRow>(q.text, q.params)).rows[0];
          if (!found || !replayOf(store, c, lookupRowOf(found))) throw new Error("no replay");
        },
      ],
    ];
    const slices = new Map<string, Slice[]>();
    for (let round = 0; round <= ROUNDS; round++) {
      for (const [path, op] of paths) {
        for (const [name, db] of Object.entries(dbs)) {
          const s = await drive(round === 0 ? 300 : SLICE_MS, () => op(stores[name]!, db));
          if (round === 0) continue;
          const k = `${name}|${path}`;
          slices.set(k, [...(slices.get(k) ?? []), s]);
        }
      }
    }
    const median = (xs: Slice[]) => [...xs].sort((a, b) => a.rate - b.rate)[Math.floor(xs.length / 2)]!;
    const rows: PreparedRow[] = [];
    console.log(
      `| driver | path (${ROUNDS} interleaved rounds) | named per s | unnamed per s | unnamed / named |\n|---|---|---:|---:|---:|`,
    );
    for (const driver of ["pg", "postgres"] as const) {
      for (const [path] of paths) {
        const named = median(slices.get(`${driver} named|${path}`)!);
        const unnamed = median(slices.get(`${driver} unnamed|${path}`)!);
        const ratio = unnamed.rate / named.rate;
        console.log(`| ${driver} | ${path} | ${f0(named.rate)} | ${f0(unnamed.rate)} | ${f2(ratio)} |`);
        rows.push({ driver, path, named, unnamed, ratio });
      }
    }
    return rows;
  } finally {
    for (const db of Object.values(dbs)) await db.close().catch(() => {});
    await fresh.drop();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  preparedBench().then(
    () => process.exit(0),
    (err) => {
      console.error(err);
      process.exit(1);
    },
  );
}
