/**
 * The atomic lookup with and without its upper bound on the bucket (atomic/sql.ts: partitions made
 * ahead hold no live row): buffers read per miss and per hit (EXPLAIN), and time per statement,
 * interleaved.
 *
 *   npx tsx --conditions=source bench/lookup-bound.ts      (DATABASE_URL)
 */
import { randomUUID } from "node:crypto";
import pg from "pg";
import { lookupQuery } from "../src/postgres/atomic/sql.ts";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../src/postgres/store.ts";
import { freshBenchDatabase } from "./http.ts";

const db = await freshBenchDatabase();
const pool = new pg.Pool({ connectionString: db.url, max: 1 });
try {
  const d = fromPg(pool, { owned: false });
  await migrate(d);
  const store = await PostgresStore.open(d);
  const claim = { scope: "acct_1", key: "hit", fingerprint: new Uint8Array(32) };
  await store.atomic(claim, async () => {
    const r = { status: 201, headers: [] as Array<[string, string]>, body: new Uint8Array(2) };
    return { response: r, save: r };
  });
  const bounded = lookupQuery(store, "acct_1", "x").text;
  const forms = { unbounded: bounded.replace(/AND bucket <= .*\n/, "\n"), bounded };
  if (forms.unbounded === bounded) throw new Error("the lookup has no upper bound to drop");
  const buffers = async (text: string, key: string) => {
    const { rows } = await pool.query(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${text}`, ["acct_1", key]);
    const plan = (rows[0] as { "QUERY PLAN": Array<{ Plan: Record<string, number> }> })["QUERY PLAN"][0]!
      .Plan;
    return (plan["Shared Hit Blocks"] ?? 0) + (plan["Shared Read Blocks"] ?? 0);
  };
  for (const [name, text] of Object.entries(forms)) {
    console.log(
      `${name}: ${await buffers(text, randomUUID())} buffers per miss, ${await buffers(text, "hit")} per hit`,
    );
  }
  const times: Record<string, number[]> = { unbounded: [], bounded: [] };
  for (let round = 0; round < 20; round++) {
    for (const [name, text] of Object.entries(forms)) {
      const t0 = performance.now();
      for (let i = 0; i < 300; i++)
        await pool.query({ name, text, values: ["acct_1", i % 2 ? "hit" : randomUUID()] });
      times[name]!.push(((performance.now() - t0) * 1000) / 300);
    }
  }
  for (const [name, ts] of Object.entries(times)) {
    const s = [...ts].sort((a, b) => a - b);
    console.log(
      `${name}: ${s[10]!.toFixed(0)} µs per lookup (median of 20 rounds; ${s[0]!.toFixed(0)}-${s[19]!.toFixed(0)})`,
    );
  }
} finally {
  await pool.end();
  await db.drop();
}
