/**
 * What the production-PostgreSQL helpers share (PgBouncer, Patroni + etcd + HAProxy): where their files
 * go, which loopback ports they take, how they are started as the `postgres` user, and how they are
 * stopped when the test process exits.
 *
 *   IDEM_INFRA_DIR        parent folder of each cluster's directory (default: the OS temp folder)
 *   IDEM_INFRA_PORT_BASE  first loopback port of the range (default 21000)
 *   IDEM_INFRA_PORT_COUNT how many ports the range holds (default 1000, up to port 65535); ports are
 *                         taken upwards inside it, each test process starting at a point of its own,
 *                         skipping busy ones. A range above 32767 works too, but Linux hands out its
 *                         ephemeral ports there (net.ipv4.ip_local_port_range), so a client's socket
 *                         may take a port first: such a port is skipped as busy.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { chown, mkdir, mkdtemp } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const asRoot = process.getuid?.() === 0;

/** The uid and gid of the `postgres` user (PostgreSQL, PgBouncer and Patroni refuse to run as root). */
export function postgresUser(): { uid: number; gid: number } {
  const uid = Number(execFileSync("id", ["-u", "postgres"], { encoding: "utf8" }).trim());
  const gid = Number(execFileSync("id", ["-g", "postgres"], { encoding: "utf8" }).trim());
  return { uid, gid };
}

/** `[bin, args]` run as `postgres` when we are root. */
export function asPostgres(bin: string, args: string[]): [string, string[]] {
  return asRoot ? ["runuser", ["-u", "postgres", "--", bin, ...args]] : [bin, args];
}

/** The first of `names` found on the PATH or in the usual sbin folders, or undefined. */
export function findBinary(...names: string[]): string | undefined {
  const dirs = [...(process.env.PATH ?? "").split(":"), "/usr/sbin", "/usr/bin", "/sbin", "/bin"];
  for (const name of names) {
    for (const dir of dirs) {
      const path = join(dir, name);
      if (dir && existsSync(path)) return path;
    }
  }
  return undefined;
}

/** A fresh directory for one cluster, owned by `postgres` when we are root. */
export async function infraDir(name: string): Promise<string> {
  const parent = process.env.IDEM_INFRA_DIR ?? tmpdir();
  await mkdir(parent, { recursive: true });
  const dir = await mkdtemp(join(parent, `idem-${name}-`));
  if (asRoot) {
    const { uid, gid } = postgresUser();
    await chown(dir, uid, gid);
  }
  return dir;
}

/** Make `path` (a folder or file we created) the `postgres` user's when we are root. */
export async function giveToPostgres(path: string): Promise<void> {
  if (!asRoot) return;
  const { uid, gid } = postgresUser();
  await chown(path, uid, gid);
}

/** The range `[first, first + count)` from the environment, checked once. */
export function infraPortRange(env: NodeJS.ProcessEnv = process.env): { first: number; count: number } {
  const first = Number(env.IDEM_INFRA_PORT_BASE ?? 21_000);
  const count = Number(env.IDEM_INFRA_PORT_COUNT ?? 1_000);
  if (!Number.isInteger(first) || first < 1024 || first > 65_535)
    throw new Error(`IDEM_INFRA_PORT_BASE=${env.IDEM_INFRA_PORT_BASE}: a port from 1024 to 65535`);
  if (!Number.isInteger(count) || count < 10)
    throw new Error(`IDEM_INFRA_PORT_COUNT=${env.IDEM_INFRA_PORT_COUNT}: a whole number of at least 10`);
  return { first, count: Math.min(count, 65_536 - first) };
}

const range = infraPortRange();
/** Where this process starts in the range, so that test files running at once rarely probe the same ports. */
const start = ((process.pid % 50) * 10) % range.count;
let taken = 0;

function bindable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once("error", () => resolve(false));
    s.listen(port, "127.0.0.1", () => s.close(() => resolve(true)));
  });
}

/** `count` loopback ports nobody listens on, taken upwards from the base (never the same twice). */
export async function infraPorts(count: number): Promise<number[]> {
  const ports: number[] = [];
  while (ports.length < count) {
    if (taken >= range.count) {
      throw new Error(
        `no free loopback port left in ${range.first}-${range.first + range.count - 1} ` +
          "(IDEM_INFRA_PORT_BASE, IDEM_INFRA_PORT_COUNT)",
      );
    }
    const port = range.first + ((start + taken++) % range.count);
    if (await bindable(port)) ports.push(port);
  }
  return ports;
}

/** Processes started here and not yet stopped: killed when the test process exits, as a backstop. */
const children = new Set<ChildProcess>();
process.once("exit", () => {
  for (const c of children) {
    try {
      if (c.pid) process.kill(-c.pid, "SIGKILL");
    } catch {
      // gone already
    }
  }
});

/**
 * Start a long-running process in a process group of its own (so that `kill(-pid)` reaches its children),
 * its output appended to `log` lines kept in memory.
 */
export function daemon(
  bin: string,
  args: string[],
  options: { asPostgres?: boolean; env?: NodeJS.ProcessEnv; cwd?: string } = {},
): { child: ChildProcess; output: () => string } {
  const [cmd, argv] = options.asPostgres ? asPostgres(bin, args) : [bin, args];
  const child = spawn(cmd, argv, {
    detached: true,
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, ...options.env },
    cwd: options.cwd,
  });
  let out = "";
  const keep = (b: Buffer) => {
    out += b.toString();
    if (out.length > 200_000) out = out.slice(-100_000);
  };
  child.stdout?.on("data", keep);
  child.stderr?.on("data", keep);
  children.add(child);
  child.once("exit", () => children.delete(child));
  return { child, output: () => out };
}

/** Send `signal` to the process group of `child` and wait (at most `ms`) for it to exit. */
export async function killGroup(child: ChildProcess, signal: NodeJS.Signals, ms = 15_000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  try {
    process.kill(-child.pid!, signal);
  } catch {
    return;
  }
  const timer = setTimeout(() => {
    try {
      process.kill(-child.pid!, "SIGKILL");
    } catch {
      // gone
    }
  }, ms);
  await exited;
  clearTimeout(timer);
}

/** Poll `check` until it returns a value (not undefined) or `ms` pass; then throw with `what`. */
export async function waitFor<T>(
  what: string,
  check: () => Promise<T | undefined>,
  ms = 60_000,
  every = 200,
): Promise<T> {
  const end = Date.now() + ms;
  let last: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > end) {
      throw new Error(`${what}: not within ${ms / 1000} s${last ? ` (${(last as Error).message})` : ""}`);
    }
    await new Promise((r) => setTimeout(r, every));
  }
}

/**
 * Why the production-PostgreSQL tests cannot run here (a missing Debian package), or undefined. In CI
 * (CI=true) a missing package fails the run instead of skipping it: .ci/run installs them.
 */
export function missing(packages: Record<string, string[]>): string | undefined {
  const absent = Object.entries(packages)
    .filter(([, bins]) => !findBinary(...bins))
    .map(([pkg]) => pkg);
  if (!absent.length) return undefined;
  const why = `missing Debian package(s): ${absent.join(", ")} (apt-get install -y ${absent.join(" ")})`;
  if (process.env.CI) throw new Error(`CI=true but ${why}`);
  return why;
}
