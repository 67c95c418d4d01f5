/**
 * The correctness columns, measured: how many times a key runs when 50 requests carry it at once, and
 * what a retry gets after the server was killed right after the handler's INSERT.
 */
import { randomUUID } from "node:crypto";
import type pg from "pg";
import { CRASH_HEADER } from "./handler.ts";
import { post } from "./requests.ts";
import type { RunningServer } from "./spawn.ts";

/** How many rows the handler wrote for each key. */
export async function executions(db: pg.Pool, keys: string[]): Promise<Map<string, number>> {
  const { rows } = await db.query<{ idem_key: string; n: number }>(
    "SELECT idem_key, count(*)::int AS n FROM payments WHERE idem_key = ANY($1) GROUP BY idem_key",
    [keys],
  );
  return new Map(keys.map((k) => [k, rows.find((r) => r.idem_key === k)?.n ?? 0]));
}

export interface SameKey {
  keys: number;
  concurrency: number;
  /** Keys that ran exactly once. */
  once: number;
  /** Run counts of the keys that ran more than once (or never). */
  others: number[];
  /** What the clients got, status -> count (0: no answer). */
  statuses: Record<string, number>;
}

/** `keys` rounds of `concurrency` requests at once with one key each; executions counted in the table. */
export async function sameKeyAtOnce(
  base: string,
  db: pg.Pool,
  prefix: string,
  keys = 20,
  concurrency = 50,
): Promise<SameKey> {
  const names = Array.from({ length: keys }, (_, i) => `${prefix}-${i}`);
  const statuses: Record<string, number> = {};
  for (const key of names) {
    const got = await Promise.all(Array.from({ length: concurrency }, () => post(base, key)));
    for (const s of got) statuses[s] = (statuses[s] ?? 0) + 1;
  }
  const runs = [...(await executions(db, names)).values()];
  return {
    keys,
    concurrency,
    once: runs.filter((n) => n === 1).length,
    others: runs.filter((n) => n !== 1),
    statuses,
  };
}

export interface Crash {
  /** The status of the first retry after the restart (0: no answer). */
  firstRetry: number;
  /** Milliseconds from the crash to the first 2xx answer; undefined if none within the window. */
  answeredAfterMs?: number;
  /** The last status seen when there was no 2xx. */
  lastStatus: number;
  /** Rows written for the key in all: 1 is right. */
  executions: number;
  /** How long the retries went on after the crash. */
  windowMs: number;
}

/**
 * Send `server` a keyed request that kills it right after the INSERT (SIGKILL, see CRASH_HEADER), then
 * retry the key on `again` (a fresh process of the same variant, started beforehand so that its start-up
 * time does not count: the restarted instance) every 500 ms until it is answered 2xx or `windowMs` has
 * passed since the crash.
 */
export async function crashAndRetry(
  server: RunningServer,
  again: RunningServer,
  db: pg.Pool,
  prefix: string,
  windowMs: number,
): Promise<Crash> {
  const key = `${prefix}-crash-${randomUUID().slice(0, 8)}`;
  await post(server.url, key, { [CRASH_HEADER]: "1" });
  const crashed = performance.now();
  await Promise.race([server.exited, new Promise((r) => setTimeout(r, 10_000))]);
  await server.stop();
  try {
    let firstRetry: number | undefined;
    let lastStatus = 0;
    let answeredAfterMs: number | undefined;
    for (;;) {
      lastStatus = await post(again.url, key);
      firstRetry ??= lastStatus;
      if (lastStatus >= 200 && lastStatus < 300) {
        answeredAfterMs = performance.now() - crashed;
        break;
      }
      if (performance.now() - crashed >= windowMs) break;
      await new Promise((r) => setTimeout(r, 500));
    }
    const runs = (await executions(db, [key])).get(key) ?? 0;
    return { firstRetry: firstRetry ?? 0, answeredAfterMs, lastStatus, executions: runs, windowMs };
  } finally {
    await again.stop();
  }
}

/** One line for the table. */
export function sameKeyVerdict(r: SameKey): string {
  if (r.once === r.keys) return `yes (${r.keys} of ${r.keys} keys once)`;
  const lo = Math.min(...r.others);
  const hi = Math.max(...r.others);
  return `no (${lo === hi ? lo : `${lo}-${hi}`} runs for ${r.others.length} of ${r.keys} keys)`;
}

export function crashVerdict(c: Crash, stuckUntil: string | undefined): string {
  const waited = c.firstRetry < 200 || c.firstRetry >= 300; // answered, but not at the first retry
  const after =
    waited && c.answeredAfterMs !== undefined
      ? ` ${(c.answeredAfterMs / 1000).toFixed(0)} s after the crash`
      : "";
  if (c.answeredAfterMs === undefined)
    return `no: stuck (${c.lastStatus || "no answer"} for ${c.windowMs / 1000} s${stuckUntil ? `; until ${stuckUntil}` : ""})`;
  if (c.executions === 1) return `yes (runs once, retry answered${after || " at once"})`;
  return `no: runs ${c.executions === 2 ? "twice" : `${c.executions} times`}${after}`;
}
