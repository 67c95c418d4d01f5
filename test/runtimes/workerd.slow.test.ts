/**
 * idem on Cloudflare's workerd (its binary from the npm registry: `workerd`). workerd reaches
 * PostgreSQL on loopback over `connect()` once its `internet` network service allows local and private
 * addresses (by default it allows public ones only, and refuses 127.0.0.1: "connecting to
 * 127.0.0.1:5432 is not allowed"). The Worker (worker.ts, bundled by esbuild with the `workerd`
 * export conditions, so postgres.js and pg take their cloudflare:sockets builds) serves the contract's
 * payments app through idem/web, and the adapter contract suite runs against it.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { cpSync, existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { builtinModules } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { afterAll, beforeAll, describe, it } from "vitest";
import { NO_SERVER, serverBackends } from "../helpers/db.ts";
import { freeLoopbackPort } from "../helpers/ports.ts";
import { type AppParts, paymentsContract, type RunningApp, useApp } from "../http/contract.ts";
import { lifecycleContract, ownBodyContract } from "../http/contract-lifecycle.ts";
import { appExtrasContract } from "./extras.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const WORKERD = `${ROOT}node_modules/.bin/workerd`;
const SQL = `${ROOT}sql`;
const SKIP = NO_SERVER ?? (existsSync(WORKERD) ? undefined : "needs the workerd binary: npm ci installs it");

let dir: string;

/** Bundle the Worker once: ESM, workerd's export conditions, Node's built-ins left to nodejs_compat. */
async function bundle(): Promise<void> {
  dir = mkdtempSync(join(tmpdir(), "idem-workerd-"));
  await build({
    entryPoints: [fileURLToPath(new URL("./worker.ts", import.meta.url))],
    bundle: true,
    format: "esm",
    platform: "neutral",
    conditions: ["workerd", "worker", "import", "module"],
    mainFields: ["module", "main"],
    external: ["cloudflare:*", ...builtinModules, ...builtinModules.map((m) => `node:${m}`)],
    // pg is CommonJS: its require() of Node's built-ins goes through nodejs_compat's createRequire.
    banner: {
      js: 'import { createRequire } from "node:module"; const require = createRequire("file:///bundle/worker.js");',
    },
    // Where idem's migrations are read from: workerd's read-only /bundle, which holds the sql/ files
    // embedded beside the Worker (config below), at the same place relative to src/postgres/schema/
    // (where migrate.ts reads them from) as in the package.
    define: { "import.meta.url": '"file:///bundle/src/postgres/schema/worker.js"' },
    outfile: join(dir, "worker.js"),
    logLevel: "error",
  });
  cpSync(SQL, join(dir, "sql"), { recursive: true }); // embedded by the config (paths relative to it)
}

/** idem's migrations as text modules, so that they are files under workerd's /bundle/sql/. */
function sqlModules(): string {
  return readdirSync(SQL)
    .filter((f) => f.endsWith(".sql"))
    .map((f) => `(name = "sql/${f}", text = embed "sql/${f}")`)
    .join(", ");
}

function config(dbUrl: string, driver: string, port: number): string {
  return `using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [
    (name = "main", worker = .worker),
    # connect() goes out through this service: let it reach loopback, where PostgreSQL is.
    (name = "internet", network = (allow = ["public", "private", "local"])),
  ],
  sockets = [(name = "http", address = "127.0.0.1:${port}", http = (), service = "main")],
);
const worker :Workerd.Worker = (
  modules = [(name = "worker.js", esModule = embed "worker.js"), ${sqlModules()}],
  compatibilityDate = "2026-06-01",
  compatibilityFlags = ["nodejs_compat"],
  bindings = [(name = "DB_URL", text = ${JSON.stringify(dbUrl)}), (name = "DRIVER", text = "${driver}")],
);
`;
}

function startWorkerd(driver: "postgres" | "pg"): (parts: AppParts) => Promise<RunningApp> {
  return async (parts) => {
    const port = await freeLoopbackPort();
    const file = join(dir, `config-${port}.capnp`);
    writeFileSync(file, config(parts.url!, driver, port));
    const child: ChildProcess = spawn(WORKERD, ["serve", file], { stdio: ["ignore", "pipe", "pipe"] });
    let output = "";
    const keep = (c: Buffer) => {
      output += c.toString();
    };
    child.stdout!.on("data", keep);
    child.stderr!.on("data", keep);
    const url = `http://127.0.0.1:${port}`;
    for (let i = 0; ; i++) {
      if (child.exitCode !== null) throw new Error(`workerd exited ${child.exitCode}:\n${output}`);
      const ok = await fetch(`${url}/_warm`).then(
        (r) => r.ok,
        () => false,
      );
      if (ok) break;
      if (i > 200) throw new Error(`workerd did not answer:\n${output}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    return {
      url,
      close: () =>
        new Promise<void>((done) => {
          if (child.exitCode !== null) return done();
          child.once("exit", () => done());
          child.kill("SIGKILL");
        }),
    };
  };
}

if (SKIP) {
  describe("workerd", () => it.skip(`skipped: ${SKIP}`, () => {}));
} else {
  beforeAll(bundle, 60_000);
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  // pg does not load in workerd from this bundle (its CommonJS modules, through nodejs_compat's
  // require, fail at start with "Class extends value #<Object> is not a constructor"): postgres.js only.
  for (const driver of ["postgres"] as const) {
    describe(`Web adapter on workerd with ${driver}`, () => {
      const app = useApp(serverBackends[0]!, startWorkerd(driver));
      paymentsContract(app);
      lifecycleContract(app);
      ownBodyContract(app, {
        clear: async () => void (await fetch(`${app.url}/_crashes`, { method: "DELETE" })),
        read: async () => (await (await fetch(`${app.url}/_crashes`)).json()) as unknown[],
      });
      appExtrasContract(app);
    });
  }
}
