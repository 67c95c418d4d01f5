/**
 * The load generator: wrk, in a process of its own, with bench/compare/load.lua choosing the key of
 * every request. One call is one slice.
 */
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { PATH } from "./handler.ts";

const SCRIPT = fileURLToPath(new URL("./load.lua", import.meta.url));

/** bare: no key; keyed: a new key each request; replay: finished keys, over and over; hot: one of them. */
export type Mode = "bare" | "keyed" | "replay" | "hot";

export interface WrkResult {
  requests: number;
  seconds: number;
  /** Connection errors, timeouts and answers with a status of 400 or more. */
  errors: number;
  p50Ms: number;
  p99Ms: number;
}

interface WrkJson {
  requests: number;
  duration_us: number;
  connect: number;
  read: number;
  write: number;
  status: number;
  timeout: number;
  p50_us: number;
  p99_us: number;
}

/** Fails with the fix when wrk is not installed. */
export function checkWrk(): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile("wrk", ["--version"], (err) => {
      // wrk --version prints its banner and exits 1
      if (err && (err as NodeJS.ErrnoException).code === "ENOENT")
        reject(new Error("wrk is not installed: apt-get install -y wrk"));
      else resolve();
    });
  });
}

export function wrk(
  base: string,
  opts: { mode: Mode; prefix: string; replayKeys: number; seconds: number; connections: number },
): Promise<WrkResult> {
  const args = [
    "-t1",
    `-c${opts.connections}`,
    `-d${Math.max(1, Math.round(opts.seconds))}s`, // wrk takes whole seconds
    "--timeout",
    "5s",
    "-s",
    SCRIPT,
    `${base}${PATH}`,
    "--",
    opts.mode === "hot" ? "replay" : opts.mode,
    opts.prefix,
    String(opts.mode === "hot" ? 1 : opts.replayKeys),
  ];
  return new Promise((resolve, reject) => {
    execFile("wrk", args, { timeout: (opts.seconds + 15) * 1000 }, (err, stdout, stderr) => {
      const line = stdout.split("\n").find((l) => l.startsWith("{"));
      if (err || !line) return reject(new Error(`wrk failed: ${err?.message ?? ""} ${stderr}`.trim()));
      const j = JSON.parse(line) as WrkJson;
      resolve({
        requests: j.requests,
        seconds: j.duration_us / 1e6,
        errors: j.connect + j.read + j.write + j.status + j.timeout,
        p50Ms: j.p50_us / 1000,
        p99Ms: j.p99_us / 1000,
      });
    });
  });
}
