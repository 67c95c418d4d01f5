/**
 * PostgreSQL's own share of a keyed request, without node or HTTP: pgbench (a C client, so nearly all
 * the CPU measured is the server's) runs the statements of the comparison's requests on this machine's
 * PostgreSQL, and the PostgreSQL CPU per request is read from /proc while it runs.
 *
 *   npx tsx --conditions=source bench/compare/pg-floor.ts      (DATABASE_URL; needs pgbench, Linux)
 *
 * Scripts (each request a new key), built from the statements the store sends today (its lock and
 * atomic/sql.ts), so they follow the code:
 *   bare     the handler's INSERT, autocommitted (the comparison's bare handler);
 *   hand-tx  bench/compare/hand.ts's transaction (claim ON CONFLICT DO NOTHING, INSERT, UPDATE);
 *   keyed    what idem's atomic mode sends for it, pipelined as with `effectsInTxOnly` (one Sync, the
 *            best case for the server): BEGIN, the lock, the locked lookup, the INSERT, the key row
 *            with its reply, COMMIT, as named prepared statements;
 *   then keyed without one part at a time, to price each part, and with two other forms tried for
 *   issue 65 (the key row into its partition by name; the lock tried first, its timeout set only when
 *   it is busy): neither was cheaper (docs/decisions/keyed-path-yardstick.md). node-postgres sends a
 *   Sync after every statement, and PostgreSQL answers each with a flush of its own: a part's price
 *   here, under one Sync, leaves that out (bench/atomic-floor.ts prices it through the driver).
 * PG_FLOOR_ROUNDS repeats the scripts in interleaved rounds (medians); PG_FLOOR_ONLY=keyed,plain picks
 * scripts by part of their label (bare always runs).
 * On a machine where node and PostgreSQL share the cores, keyed/bare here bounds what keyed/bare
 * throughput can reach even if idem's node side cost nothing: see the README's Benchmarks section.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fromPg, migrate, PostgresStore } from "idem/postgres";
import pg from "pg";
import type { AtomicSql } from "../../src/postgres/atomic/sql.ts";
import { freshBenchDatabase } from "../http.ts";
import { backendsCpu, backendsDelta } from "./cpu.ts";
import { PAYMENTS_DDL } from "./handler.ts";
import { median } from "./index.ts";

const SECONDS = Number(process.env.PG_FLOOR_SECONDS ?? 6);
const ROUNDS = Number(process.env.PG_FLOOR_ROUNDS ?? 1);
const CLIENTS = 10; // the comparison's pool size

/** What a statement of the store's reads as a pgbench command: its parameters as SQL expressions. */
function bind(sql: string, params: string[]): string {
  return `${sql.replace(/\$(\d+)/g, (_, i: string) => params[Number(i) - 1]!).replace(/\s+/g, " ")};`;
}

/**
 * The scripts, from the statements the store sends today (`store`: its lock and atomic/sql.ts), so
 * that they follow the code; the hand-written transaction's are bench/compare/hand.ts's.
 */
function scripts(store: PostgresStore, bucket: number): Record<string, string> {
  const key = "('k' || :n)";
  const sql = (store as unknown as { statements: AtomicSql }).statements;
  const lock = store.lockSql("acct_bench", "k");
  const insertDone = bind(sql.insertDone, [
    "'acct_bench'",
    key,
    `sha256(${key}::bytea)`,
    "201",
    `'[["content-type","application/json"]]'`,
    "'\\x7b226964223a317d'::bytea",
    "NULL",
    "gen_random_uuid()",
  ]);
  const parts = {
    begin: "BEGIN;",
    lock:
      typeof lock === "string"
        ? lock.replace(/pg_advisory_xact_lock\(\S+\)/, "pg_advisory_xact_lock(:n)")
        : bind(lock.sql, [":n"]),
    lookup: bind(sql.lockedLookupAround(Date.now()), ["'acct_bench'", key]),
    insert: `INSERT INTO payments (idem_key, amount_cents, currency) VALUES (${key}, 5000, 'eur') RETURNING id, amount_cents, currency;`,
    // The lock tried first, waited for (with its timeout) only when another transaction holds it.
    tryLock: `SELECT FROM (SELECT pg_try_advisory_xact_lock(:n::bigint) AS got OFFSET 0) t WHERE CASE WHEN t.got THEN true ELSE (SELECT set_config('lock_timeout', w.prev, true) IS NOT NULL FROM (SELECT current_setting('lock_timeout') AS prev, set_config('lock_timeout', '10ms', true) AS wait, pg_advisory_xact_lock(:n::bigint) AS locked OFFSET 0) w) END;`,
    keyRow: insertDone,
    // The key row into its partition by name, its bucket a constant (no routing, no bucket worked out).
    keyRowDirect: insertDone
      .replace(/INSERT INTO (\S+)\.keys \(/, `INSERT INTO $1.keys_b${bucket} (`)
      .replace(/VALUES \(floor\(extract\(epoch FROM now\(\)\) \* 1000 \/ \d+\)::int,/, `VALUES (${bucket},`),
    handClaim: `INSERT INTO hand_keys (key) VALUES (${key}) ON CONFLICT DO NOTHING;`,
    handSave: `UPDATE hand_keys SET status = 201, body = '{"id":1}' WHERE key = ${key};`,
    commit: "COMMIT;",
  };
  const head = "\\set n random(1, 1000000000000000)\n";
  const piped = (names: (keyof typeof parts)[]) =>
    `${head}\\startpipeline\n${names.map((n) => parts[n]).join("\n")}\n\\endpipeline\n`;
  const all: (keyof typeof parts)[] = ["begin", "lock", "lookup", "insert", "keyRow", "commit"];
  const without = (...drop: (keyof typeof parts)[]) => all.filter((p) => !drop.includes(p));
  return {
    bare: `${head}${parts.insert}\n`,
    "hand-tx": piped(["begin", "handClaim", "insert", "handSave", "commit"]),
    "keyed as sent today": piped(all),
    "keyed without the lock": piped(without("lock")),
    "keyed without the lookup": piped(without("lookup")),
    "keyed without the key row": piped(without("keyRow")),
    "keyed, the key row into its partition": piped(all.map((p) => (p === "keyRow" ? "keyRowDirect" : p))),
    "keyed, the lock tried first": piped(all.map((p) => (p === "lock" ? "tryLock" : p))),
    "the INSERT in a transaction": piped(["begin", "insert", "commit"]),
  };
}

/** Run pgbench for SECONDS and read the CPU of the database's backends from second 2 to SECONDS - 1. */
async function measure(url: string, admin: pg.Client, db: string, file: string) {
  const u = new URL(url);
  const child = spawn(
    "pgbench",
    ["-h", u.hostname, "-p", u.port || "5432", "-U", u.username || "postgres", "-n", "-M", "prepared"].concat(
      ["-c", String(CLIENTS), "-j", "2", "-T", String(SECONDS), "-P", "1", "-f", file, db],
    ),
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let err = "";
  let out = "";
  child.stderr.on("data", (d) => {
    err += d;
  });
  child.stdout.on("data", (d) => {
    out += d;
  });
  const exited = new Promise<number | null>((r) => child.once("exit", r));
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
  await sleep(2000);
  const t0 = performance.now();
  const cpu0 = await backendsCpu(admin, db);
  await sleep((SECONDS - 3) * 1000);
  const cpu1 = await backendsCpu(admin, db);
  const seconds = (performance.now() - t0) / 1000;
  const code = await exited;
  if (code !== 0) throw new Error(`pgbench failed: ${err.trim().split("\n").slice(-3).join(" | ")}`);
  const tps = Number(/tps = ([\d.]+)/.exec(out)?.[1] ?? 0);
  return { tps, cpuUs: backendsDelta(cpu0, cpu1) / (tps * seconds) };
}

const db = await freshBenchDatabase();
const dir = mkdtempSync(join(tmpdir(), "idem-pg-floor-"));
const admin = new pg.Client({
  connectionString: process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test",
});
try {
  await admin.connect();
  const pool = new pg.Pool({ connectionString: db.url, max: 1 });
  await pool.query(PAYMENTS_DDL);
  await migrate(fromPg(pool, { owned: false }));
  const store = await PostgresStore.open(fromPg(pool, { owned: false })); // creates today's partitions
  await pool.end();
  const name = new URL(db.url).pathname.slice(1);
  const bucket = store.partitions.bucketOf(Date.now());
  console.log(
    `PostgreSQL CPU per request, pgbench -M prepared, ${CLIENTS} clients, ${SECONDS} s each, ${ROUNDS} round(s): median (range)`,
  );
  // Rounds of every script in turn (PG_FLOOR_ROUNDS, default 1): the server's CPU per statement drifts
  // over minutes on a shared machine, so compare medians of interleaved rounds, not one pass.
  const all = Object.entries(scripts(store, bucket));
  const only = process.env.PG_FLOOR_ONLY?.split(",");
  const chosen = all.filter(([label]) => label === "bare" || !only || only.some((o) => label.includes(o)));
  const got = new Map<string, { tps: number; cpuUs: number }[]>();
  const files = chosen.map(([label, text]) => {
    const file = join(dir, `${label.replaceAll(" ", "-")}.sql`);
    writeFileSync(file, text);
    return [label, file] as const;
  });
  for (let round = 0; round < ROUNDS; round++) {
    for (const [label, file] of files) {
      got.set(label, [...(got.get(label) ?? []), await measure(db.url, admin, name, file)]);
    }
  }
  const bareUs = median(got.get("bare")!.map((r) => r.cpuUs));
  for (const [label, rs] of got) {
    const cpuUs = median(rs.map((r) => r.cpuUs));
    const spread =
      rs.length > 1
        ? ` (${Math.min(...rs.map((r) => r.cpuUs)).toFixed(0)}-${Math.max(...rs.map((r) => r.cpuUs)).toFixed(0)})`
        : "";
    console.log(
      `  ${label.padEnd(36)} ${median(rs.map((r) => r.tps))
        .toFixed(0)
        .padStart(6)} tx/s  ${cpuUs.toFixed(0).padStart(4)} µs${spread}` +
        `  ${(cpuUs / bareUs).toFixed(2)} x bare`,
    );
  }
} finally {
  await admin.end().catch(() => {});
  await db.drop();
  rmSync(dir, { recursive: true, force: true });
}
