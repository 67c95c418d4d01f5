/** Start one variant's server in a child process (bench/compare/server.ts) and stop it. */
import { type ChildProcess, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

const SERVER = fileURLToPath(new URL("./server.ts", import.meta.url));

/**
 * idem as users run it: the built package (dist/, `npm run build`), not the TypeScript sources through
 * tsx's loader, whose keep-names wrapper costs a call on every closure created per request.
 * BENCH_SOURCE=1 runs the sources instead (no build needed while optimising).
 */
export const FROM_SOURCE = process.env.BENCH_SOURCE === "1";

export interface RunningServer {
  name: string;
  url: string;
  /** The server's own process (node with tsx's loader, not a tsx wrapper): its CPU is the server's. */
  pid: number;
  child: ChildProcess;
  exited: Promise<number | null>;
  stop(): Promise<void>;
}

/**
 * Extra node flags for the servers, e.g. BENCH_SERVER_NODE_ARGS="--cpu-prof --cpu-prof-dir=/tmp/prof"
 * to profile them (NODE_OPTIONS refuses --cpu-prof). A server writes its profile when stopped.
 */
const SERVER_NODE_ARGS = (process.env.BENCH_SERVER_NODE_ARGS ?? "").split(" ").filter(Boolean);

export function startServer(
  name: string,
  env: Record<string, string>,
  timeoutMs = 60_000,
): Promise<RunningServer> {
  const child = spawn(
    process.execPath,
    [...SERVER_NODE_ARGS, "--import", "tsx", ...(FROM_SOURCE ? ["--conditions=source"] : []), SERVER, name],
    {
      env: { ...process.env, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  let out = "";
  let err = "";
  child.stderr!.on("data", (d) => {
    err = (err + d).slice(-4000);
  });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`${name}: no 'listening' line within ${timeoutMs / 1000} s`));
    }, timeoutMs);
    child.stdout!.on("data", (d) => {
      out += d;
      const m = /listening (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve({
          name,
          url: m[1]!,
          pid: child.pid!,
          child,
          exited,
          async stop() {
            if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
            await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))]);
            if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
          },
        });
      }
    });
    void exited.then((code) => {
      clearTimeout(timer);
      reject(
        new Error(
          `${name}: server exited (${code}) before listening: ${err.trim().split("\n").slice(-5).join(" | ")}`,
        ),
      );
    });
  });
}
