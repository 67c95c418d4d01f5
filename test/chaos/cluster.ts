/**
 * A private PostgreSQL cluster for the chaos test: its own data directory and port, so the test can
 * restart it without touching the machine's shared server (other test files use that one at the same
 * time). `initdb` refuses to run as root, so as root every server command runs as the `postgres` OS
 * user (`runuser -u postgres --`).
 */
import { execFile } from "node:child_process";
import { chownSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

export interface Cluster {
  /** postgres://postgres@127.0.0.1:<port>/postgres */
  adminUrl: string;
  port: number;
  dataDir: string;
  /** `pg_ctl restart -m fast`: every connection is cut, the server is back when it returns. */
  restart(): Promise<void>;
  /** Stop the server (immediately) and delete its directory. Safe to call twice. */
  destroy(): Promise<void>;
  /** The server's log so far (for failure messages). */
  log(): string;
}

/** The directory of PostgreSQL's server binaries (initdb, pg_ctl), newest version first; or undefined. */
export function findServerBin(): string | undefined {
  const fromEnv = process.env.PG_BIN;
  if (fromEnv && existsSync(join(fromEnv, "initdb"))) return fromEnv;
  const root = "/usr/lib/postgresql";
  if (!existsSync(root)) return undefined;
  const versions = readdirSync(root)
    .filter((v) => existsSync(join(root, v, "bin", "initdb")))
    .sort((a, b) => Number(b) - Number(a));
  return versions[0] ? join(root, versions[0], "bin") : undefined;
}

/** Why a private cluster cannot be made here, or undefined if it can. */
export function clusterUnavailable(): string | undefined {
  if (!findServerBin()) return "no PostgreSQL server binaries (initdb) under /usr/lib/postgresql or $PG_BIN";
  if (process.getuid?.() === 0 && !existsSync("/usr/sbin/runuser") && !existsSync("/sbin/runuser")) {
    return "running as root without runuser (initdb refuses root)";
  }
  return undefined;
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

export async function createCluster(): Promise<Cluster> {
  const bin = findServerBin();
  if (!bin) throw new Error("no PostgreSQL server binaries found");
  const asRoot = process.getuid?.() === 0;
  // As root, run the server's tools as `postgres`; as anyone else, as ourselves.
  const cmd = async (file: string, args: string[]) => {
    const [exe, argv] = asRoot ? ["runuser", ["-u", "postgres", "--", file, ...args]] : [file, args];
    return run(exe, argv, { timeout: 60_000 });
  };
  const base = mkdtempSync(join(tmpdir(), "idem-chaos-pg-"));
  if (asRoot) {
    const { stdout: uid } = await run("id", ["-u", "postgres"]);
    const { stdout: gid } = await run("id", ["-g", "postgres"]);
    chownSync(base, Number(uid), Number(gid));
  }
  const dataDir = join(base, "data");
  const logFile = join(base, "server.log");
  const port = await freePort();
  const pgCtl = join(bin, "pg_ctl");
  let stopped = false;
  const destroy = async () => {
    if (stopped) return;
    stopped = true;
    if (existsSync(join(dataDir, "postmaster.pid"))) {
      await cmd(pgCtl, ["-D", dataDir, "-m", "immediate", "-w", "stop"]).catch(() => {});
    }
    rmSync(base, { recursive: true, force: true });
  };
  try {
    await cmd(join(bin, "initdb"), [
      "-D",
      dataDir,
      "-A",
      "trust",
      "-U",
      "postgres",
      "-E",
      "UTF8",
      "--no-sync",
    ]);
    // Loopback only, socket in our own directory; enough connections for the service, the completer
    // and the checks; a short checkpoint timeout is not needed (restart -m fast checkpoints anyway).
    const opts = `-p ${port} -k ${base} -c listen_addresses=127.0.0.1 -c max_connections=100`;
    await cmd(pgCtl, ["-D", dataDir, "-o", opts, "-l", logFile, "-w", "-t", "60", "start"]);
  } catch (err) {
    const log = existsSync(logFile) ? readFileSync(logFile, "utf8") : "";
    await destroy();
    throw new Error(`could not start a private PostgreSQL cluster: ${(err as Error).message}\n${log}`);
  }
  return {
    adminUrl: `postgres://postgres@127.0.0.1:${port}/postgres`,
    port,
    dataDir,
    async restart() {
      await cmd(pgCtl, ["-D", dataDir, "-m", "fast", "-w", "-t", "60", "-l", logFile, "restart"]);
    },
    destroy,
    log: () => (existsSync(logFile) ? readFileSync(logFile, "utf8") : ""),
  };
}
