/**
 * Throwaway PostgreSQL clusters for tests that need a server of their own (the region simulation, the
 * chaos suite that restarts PostgreSQL): `initdb` in a temporary directory, started with `pg_ctl` on a
 * free loopback port, stopped and deleted by `stop()` (and on process exit, as a backstop). Run as the
 * `postgres` user when the tests run as root (initdb refuses root). Nothing listens beyond 127.0.0.1.
 */
import { execFile, execFileSync } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { chown, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

/** The directory holding initdb and pg_ctl, or undefined when PostgreSQL's server binaries are missing. */
export function postgresBinDir(): string | undefined {
  const fromEnv = process.env.PG_BINDIR;
  if (fromEnv && existsSync(join(fromEnv, "initdb"))) return fromEnv;
  try {
    const dir = execFileSync("pg_config", ["--bindir"], { encoding: "utf8" }).trim();
    if (existsSync(join(dir, "initdb"))) return dir;
  } catch {
    // no pg_config on the PATH: look in Debian's place
  }
  const root = "/usr/lib/postgresql";
  if (!existsSync(root)) return undefined;
  const versions = readdirSync(root)
    .filter((v) => existsSync(join(root, v, "bin", "initdb")))
    .sort((a, b) => Number(b) - Number(a));
  return versions[0] ? join(root, versions[0], "bin") : undefined;
}

const asRoot = process.getuid?.() === 0;

/** The uid and gid to run PostgreSQL as when we are root. */
function postgresUser(): { uid: number; gid: number } {
  const uid = Number(execFileSync("id", ["-u", "postgres"], { encoding: "utf8" }).trim());
  const gid = Number(execFileSync("id", ["-g", "postgres"], { encoding: "utf8" }).trim());
  return { uid, gid };
}

function command(bin: string, args: string[]): [string, string[]] {
  return asRoot ? ["runuser", ["-u", "postgres", "--", bin, ...args]] : [bin, args];
}

/** Why a private cluster cannot be made here, or undefined if it can. */
export function clusterUnavailable(): string | undefined {
  if (!postgresBinDir())
    return "no PostgreSQL server binaries (initdb) under /usr/lib/postgresql or $PG_BINDIR";
  if (asRoot && !existsSync("/usr/sbin/runuser") && !existsSync("/sbin/runuser")) {
    return "running as root without runuser (initdb refuses root)";
  }
  return undefined;
}

/** A port nobody listens on at 127.0.0.1, preferring `preferred` (0: any). */
export async function freePort(preferred = 0): Promise<number> {
  const tryPort = (port: number) =>
    new Promise<number | undefined>((resolve) => {
      const s = createServer();
      s.once("error", () => resolve(undefined));
      s.listen(port, "127.0.0.1", () => {
        const got = (s.address() as { port: number }).port;
        s.close(() => resolve(got));
      });
    });
  return (await tryPort(preferred)) ?? (await tryPort(0))!;
}

export interface Cluster {
  name: string;
  port: number;
  /** postgres://postgres@127.0.0.1:<port>/postgres */
  url: string;
  /** `pg_ctl restart -m fast`: every connection is cut; the server is back when it resolves. */
  restart(): Promise<void>;
  /** Stop the server at once and delete its directory. Safe to call twice. */
  stop(): Promise<void>;
  /** The server's log so far (for failure messages). */
  log(): Promise<string>;
}

/** Every cluster not yet stopped, so that an exiting test process never leaves one running. */
const running = new Map<string, () => void>();
process.once("exit", () => {
  for (const stop of running.values()) stop();
});

/**
 * Start a cluster. Its defaults trade durability for speed (fsync off); pass `settings` to change them.
 */
export async function startCluster(
  name: string,
  options: { bin?: string; port?: number; settings?: Record<string, string | number> } = {},
): Promise<Cluster> {
  const bin = options.bin ?? postgresBinDir();
  if (!bin) throw new Error("no PostgreSQL server binaries (initdb) found");
  const port = options.port ?? (await freePort());
  const dir = await mkdtemp(join(tmpdir(), `idem-region-${name}-`));
  const data = join(dir, "data");
  const logFile = join(dir, "server.log");
  if (asRoot) {
    const { uid, gid } = postgresUser();
    await chown(dir, uid, gid);
  }
  const pgCtl = join(bin, "pg_ctl");
  const stopSync = () => {
    try {
      execFileSync(...command(pgCtl, ["-D", data, "-m", "immediate", "-w", "-t", "10", "stop"]), {
        stdio: "ignore",
      });
    } catch {
      // not running
    }
    try {
      execFileSync("rm", ["-rf", dir]);
    } catch {
      // best effort
    }
  };
  running.set(dir, stopSync);
  const cluster: Cluster = {
    name,
    port,
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    async restart() {
      await run(...command(pgCtl, ["-D", data, "-m", "fast", "-w", "-t", "60", "-l", logFile, "restart"]), {
        timeout: 70_000,
      });
    },
    async stop() {
      if (!running.delete(dir)) return;
      await run(...command(pgCtl, ["-D", data, "-m", "immediate", "-w", "-t", "10", "stop"]), {
        timeout: 15_000,
      }).catch(() => {});
      await rm(dir, { recursive: true, force: true });
    },
    log: () => readFile(logFile, "utf8").catch(() => ""),
  };
  try {
    await run(
      ...command(join(bin, "initdb"), [
        "-D",
        data,
        "-U",
        "postgres",
        "--auth=trust",
        "-E",
        "UTF8",
        "--no-sync",
      ]),
      { timeout: 60_000 },
    );
    const settings: Record<string, string | number> = {
      port,
      listen_addresses: "'127.0.0.1'",
      unix_socket_directories: `'${dir}'`,
      fsync: "off",
      synchronous_commit: "off",
      full_page_writes: "off",
      max_connections: 40,
      shared_buffers: "'32MB'",
      ...options.settings,
    };
    const conf = Object.entries(settings)
      .map(([k, v]) => `${k} = ${v}`)
      .join("\n");
    await writeFile(join(data, "postgresql.auto.conf"), `${conf}\n`);
    if (asRoot) {
      const { uid, gid } = postgresUser();
      await chown(join(data, "postgresql.auto.conf"), uid, gid);
    }
    await run(...command(pgCtl, ["-D", data, "-l", logFile, "-w", "-t", "30", "start"]), { timeout: 40_000 });
  } catch (err) {
    const log = await cluster.log();
    await cluster.stop();
    throw new Error(`could not start the cluster ${name} on port ${port}: ${(err as Error).message}\n${log}`);
  }
  return cluster;
}
