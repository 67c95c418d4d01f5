/**
 * A private PgBouncer (Debian's `pgbouncer`) in front of a PostgreSQL server, in transaction pooling
 * mode unless told otherwise: every database name is forwarded (`* =`), so a test's fresh database is
 * reachable through it at once. Trust authentication for the users listed (the server behind trusts
 * loopback). `stop()` ends it and deletes its directory.
 *
 *   const bouncer = await startPgBouncer({ server: "127.0.0.1:5432" });
 *   bouncer.url("mydb")   // postgres://postgres@127.0.0.1:<port>/mydb
 */
import { execFile } from "node:child_process";
import { rm, writeFile } from "node:fs/promises";
import { connect } from "node:net";
import { join } from "node:path";
import { promisify } from "node:util";
import pg from "pg";
import { daemon, findBinary, giveToPostgres, infraDir, infraPorts, killGroup, waitFor } from "./common.ts";

const run = promisify(execFile);

export interface PgBouncer {
  port: number;
  /** A URL through the pooler to `database` as `user` (default postgres). */
  url(database: string, user?: string): string;
  /** Run a command on PgBouncer's admin console (`SHOW POOLS`, `RECONNECT`, ...). */
  admin(command: string): Promise<Record<string, unknown>[]>;
  output(): string;
  stop(): Promise<void>;
}

export function pgbouncerBinary(): string | undefined {
  return findBinary("pgbouncer");
}

export async function startPgBouncer(options: {
  /** host:port of the PostgreSQL server behind it. */
  server: string;
  poolMode?: "transaction" | "session";
  /** Users allowed through (trusted). Default: postgres. */
  users?: string[];
  /** Server connections per (database, user). Default 10. */
  poolSize?: number;
}): Promise<PgBouncer> {
  const bin = pgbouncerBinary();
  if (!bin) throw new Error("pgbouncer is not installed (apt-get install -y pgbouncer)");
  const [host, serverPort] = options.server.split(":");
  const dir = await infraDir("pgbouncer");
  const users = options.users ?? ["postgres"];
  for (let attempt = 0; ; attempt++) {
    const port = (await infraPorts(1))[0]!;
    const conf = join(dir, "pgbouncer.ini");
    await writeFile(join(dir, "users.txt"), users.map((u) => `"${u}" ""`).join("\n") + "\n");
    await writeFile(
      conf,
      `[databases]
* = host=${host} port=${serverPort}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = ${port}
unix_socket_dir =
auth_type = trust
auth_file = ${join(dir, "users.txt")}
admin_users = postgres
pool_mode = ${options.poolMode ?? "transaction"}
default_pool_size = ${options.poolSize ?? 10}
max_client_conn = 1000
max_db_connections = 0
server_check_delay = 0
server_login_retry = 1
ignore_startup_parameters = extra_float_digits,options
pidfile = ${join(dir, "pgbouncer.pid")}
logfile = ${join(dir, "pgbouncer.log")}
`,
    );
    for (const f of ["users.txt", "pgbouncer.ini"]) await giveToPostgres(join(dir, f));
    const proc = daemon(bin, [conf], { asPostgres: true });
    const up = await waitFor(
      `PgBouncer on port ${port}`,
      async () => {
        if (proc.child.exitCode !== null) return false;
        return (await reachable(port)) ? true : undefined;
      },
      20_000,
      100,
    ).catch(() => false);
    if (!up) {
      await killGroup(proc.child, "SIGKILL");
      if (attempt < 3) continue; // the port was taken meanwhile
      const log = await run("cat", [join(dir, "pgbouncer.log")]).catch(() => ({ stdout: "" }));
      throw new Error(`PgBouncer did not start: ${proc.output()}\n${log.stdout}`);
    }
    const url = (database: string, user = "postgres") => `postgres://${user}@127.0.0.1:${port}/${database}`;
    return {
      port,
      url,
      async admin(command) {
        // The admin console speaks the simple query protocol only.
        const c = new pg.Client({ connectionString: url("pgbouncer") });
        await c.connect();
        try {
          return ((await c.query(command)) as { rows: Record<string, unknown>[] }).rows ?? [];
        } finally {
          await c.end();
        }
      },
      output: proc.output,
      async stop() {
        await killGroup(proc.child, "SIGTERM");
        await rm(dir, { recursive: true, force: true });
      },
    };
  }
}

function reachable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(port, "127.0.0.1");
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });
}
