/**
 * CPU time read from /proc (Linux; zeros elsewhere): of one process, of the PostgreSQL backends serving
 * one database, and of the Redis server. Read before and after a slice, divided by its requests, it says
 * where a request's CPU goes on a machine where all of them share the cores.
 */
import { readdirSync, readFileSync } from "node:fs";
import type pg from "pg";

const US_PER_TICK = 1e6 / 100; // USER_HZ is 100 on Linux

/** utime + stime of a process in µs, 0 when it is gone or there is no /proc. */
export function processCpuUs(pid: number): number {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
    return (Number(fields[11]) + Number(fields[12])) * US_PER_TICK; // utime + stime
  } catch {
    return 0;
  }
}

/** The pids of the processes named `comm` (e.g. redis-server, postgres). */
function* processesNamed(comm: string): Generator<number> {
  let pids: string[];
  try {
    pids = readdirSync("/proc").filter((pid) => /^\d+$/.test(pid));
  } catch {
    return; // no /proc
  }
  for (const pid of pids) {
    try {
      if (readFileSync(`/proc/${pid}/comm`, "utf8").trim() === comm) yield Number(pid);
    } catch {
      // gone meanwhile
    }
  }
}

/** The pid of the first process named `comm` (e.g. redis-server), or undefined. */
export function findProcess(comm: string): number | undefined {
  for (const pid of processesNamed(comm)) return pid;
  return undefined;
}

/**
 * utime + stime in µs of every process named `comm` now running: with "postgres", the server's
 * backends of every database and its background processes (WAL writer, checkpointer, autovacuum).
 */
export function processesCpuUs(comm: string): number {
  let us = 0;
  for (const pid of processesNamed(comm)) us += processCpuUs(pid);
  return us;
}

/**
 * CPU per backend of one database, keyed by pid. Only this database's backends: other work on the same
 * server (other databases) is not counted.
 */
export async function backendsCpu(admin: pg.Client, database: string): Promise<Map<number, number>> {
  const { rows } = await admin.query<{ pid: number }>("SELECT pid FROM pg_stat_activity WHERE datname = $1", [
    database,
  ]);
  return new Map(rows.map((r) => [r.pid, processCpuUs(r.pid)]));
}

/** CPU the backends used between two readings; a backend that began meanwhile counts from zero. */
export function backendsDelta(before: Map<number, number>, after: Map<number, number>): number {
  let us = 0;
  for (const [pid, cpu] of after) us += cpu - (before.get(pid) ?? 0);
  return us;
}
