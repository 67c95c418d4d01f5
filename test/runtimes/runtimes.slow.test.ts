/**
 * idem on Bun and Deno, their binaries from the npm registry (`bun`, `deno`): the Web adapter on each
 * runtime's own server, with postgres.js and with pg, runs the adapter contract suite (test/http/),
 * plus `writeOutbox` in a keyed route and idem's client, both run inside the runtime.
 * Cloudflare's workerd is in workerd.slow.test.ts.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, it } from "vitest";
import { NO_SERVER, serverBackends } from "../helpers/db.ts";
import { type AppParts, paymentsContract, type RunningApp, useApp } from "../http/contract.ts";
import { lifecycleContract, ownBodyContract } from "../http/contract-lifecycle.ts";
import { appExtrasContract } from "./extras.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const SERVE = fileURLToPath(new URL("./serve.ts", import.meta.url));

export const RUNTIMES = {
  bun: { bin: `${ROOT}node_modules/.bin/bun`, args: [SERVE] },
  deno: { bin: `${ROOT}node_modules/.bin/deno`, args: ["run", "--allow-all", SERVE] },
} as const;

/** Start `runtime` serving the contract's app on the database `parts.url`; resolve once it listens. */
export function startRuntime(
  runtime: keyof typeof RUNTIMES,
  driver: "postgres" | "pg",
): (parts: AppParts) => Promise<RunningApp> {
  return async (parts) => {
    const { bin, args } = RUNTIMES[runtime];
    const child: ChildProcess = spawn(bin, [...args], {
      cwd: ROOT,
      env: { ...process.env, IDEM_DB_URL: parts.url, IDEM_DRIVER: driver, NO_COLOR: "1" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    const port = await new Promise<number>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${runtime} did not start:\n${output}`)), 60_000);
      const onData = (chunk: Buffer) => {
        output += chunk.toString();
        const m = /listening (\d+)/.exec(output);
        if (m) {
          clearTimeout(timer);
          resolve(Number(m[1]));
        }
      };
      child.stdout!.on("data", onData);
      child.stderr!.on("data", onData);
      child.on("exit", (code) => reject(new Error(`${runtime} exited ${code}:\n${output}`)));
    });
    return {
      url: `http://127.0.0.1:${port}`,
      close: () =>
        new Promise<void>((done) => {
          if (child.exitCode !== null) return done();
          child.once("exit", () => done());
          child.kill("SIGKILL");
        }),
    };
  };
}

function missing(runtime: keyof typeof RUNTIMES): string | undefined {
  if (NO_SERVER) return NO_SERVER;
  if (!existsSync(RUNTIMES[runtime].bin))
    return `needs the ${runtime} binary: npm ci installs it (devDependency)`;
  return undefined;
}

const combos = (["bun", "deno"] as const).flatMap((runtime) =>
  (["postgres", "pg"] as const).map((driver) => ({ runtime, driver, skip: missing(runtime) })),
);

for (const { runtime, driver, skip } of combos) {
  if (skip) {
    describe(`${runtime} with ${driver}`, () => it.skip(`skipped: ${skip}`, () => {}));
    continue;
  }
  describe(`Web adapter on ${runtime} with ${driver}`, () => {
    const app = useApp(serverBackends[0]!, startRuntime(runtime, driver));
    paymentsContract(app, { hangUp: true });
    lifecycleContract(app);
    ownBodyContract(app, {
      clear: async () => void (await fetch(`${app.url}/_crashes`, { method: "DELETE" })),
      read: async () => (await (await fetch(`${app.url}/_crashes`)).json()) as unknown[],
    });

    appExtrasContract(app);
  });
}
