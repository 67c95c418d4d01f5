/**
 * A private Citus cluster on loopback: a coordinator and two workers (PostgreSQL 15 with the `citus`
 * extension, installed by ../shared/vendor/install-citus.sh), each `initdb`-ed into a temporary folder,
 * started with `shared_preload_libraries = citus` on its own port from IDEM_INFRA_PORT_BASE, and torn
 * down by `stop()`. `database()` makes a fresh database on all three nodes with the extension created
 * and the workers registered (metadata synced to them, so any node takes queries).
 *
 *   const citus = await startCitus();
 *   const d = await citus.database();
 *   d.url("coordinator") / d.url("worker1")   // postgres://postgres@127.0.0.1:<port>/<name>
 */
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { rm } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import pg from "pg";
import { postgresBinDir } from "../helpers/cluster.ts";
import { asPostgres, daemon, infraDir, infraPorts, killGroup, waitFor } from "./common.ts";

const run = promisify(execFile);

export type CitusNode = "coordinator" | "worker1" | "worker2";
export const CITUS_NODES: CitusNode[] = ["coordinator", "worker1", "worker2"];

export interface CitusDatabase {
  name: string;
  url(node?: CitusNode): string;
  drop(): Promise<void>;
}

export interface CitusCluster {
  ports: Record<CitusNode, number>;
  /** A fresh database on every node, the extension created and the workers added. */
  database(prefix?: string): Promise<CitusDatabase>;
  stop(): Promise<void>;
}

/** Why a Citus cluster cannot be brought up here, or undefined. In CI a missing piece fails instead. */
export function citusUnavailable(): string | undefined {
  const bin = postgresBinDir();
  let why: string | undefined;
  if (!bin) why = "no PostgreSQL server binaries (initdb)";
  else {
    const lib = join(bin, "..", "lib", "citus.so");
    if (!existsSync(lib)) why = `Citus is not installed (${lib}): run ../shared/vendor/install-citus.sh`;
  }
  if (why && process.env.CI) throw new Error(`CI=true but ${why}`);
  return why;
}

async function query(url: string, sql: string, params: unknown[] = []): Promise<pg.QueryResult> {
  const c = new pg.Client({ connectionString: url });
  c.on("error", () => {});
  await c.connect();
  try {
    return await c.query(sql, params);
  } finally {
    await c.end().catch(() => {});
  }
}

export async function startCitus(): Promise<CitusCluster> {
  const bin = postgresBinDir();
  if (!bin) throw new Error("no PostgreSQL server binaries");
  const dir = await infraDir("citus");
  const template = join(dir, "template");
  const [cmd, args] = asPostgres(join(bin, "initdb"), [
    "-D",
    template,
    "-U",
    "postgres",
    "--auth=trust",
    "--no-sync",
    "-E",
    "UTF8",
  ]);
  await run(cmd, args);
  const procs: ReturnType<typeof daemon>[] = [];
  const ports = {} as Record<CitusNode, number>;
  const portList = await infraPorts(3);
  await Promise.all(
    CITUS_NODES.map(async (node, i) => {
      const data = join(dir, node);
      const [cp, cpArgs] = asPostgres("cp", ["-a", template, data]);
      await run(cp, cpArgs);
      const port = portList[i]!;
      ports[node] = port;
      const proc = daemon(
        join(bin, "postgres"),
        [
          "-D",
          data,
          "-p",
          String(port),
          "-k",
          dir,
          "-c",
          "listen_addresses=127.0.0.1",
          "-c",
          "shared_preload_libraries=citus",
          "-c",
          "fsync=off",
          "-c",
          "synchronous_commit=off",
          "-c",
          "full_page_writes=off",
          "-c",
          "shared_buffers=32MB",
          "-c",
          "max_connections=200",
          "-c",
          "max_prepared_transactions=100",
          "-c",
          "citus.max_cached_conns_per_worker=4",
        ],
        { asPostgres: true },
      );
      procs.push(proc);
      await waitFor(
        `Citus ${node} on port ${port}`,
        async () => {
          if (proc.child.exitCode !== null) throw new Error(proc.output().slice(-2_000));
          await query(`postgres://postgres@127.0.0.1:${port}/postgres`, "SELECT 1");
          return true;
        },
        30_000,
        100,
      );
    }),
  );
  const urlOf = (node: CitusNode, db: string) => `postgres://postgres@127.0.0.1:${ports[node]}/${db}`;
  const databases = new Set<string>();
  const cluster: CitusCluster = {
    ports,
    async database(prefix = "idem_citus") {
      const name = `${prefix}_${randomBytes(5).toString("hex")}`;
      await Promise.all(
        CITUS_NODES.map(async (node) => {
          await query(urlOf(node, "postgres"), `CREATE DATABASE ${name}`);
          await query(urlOf(node, name), "CREATE EXTENSION citus");
        }),
      );
      databases.add(name);
      const coord = urlOf("coordinator", name);
      await query(coord, "SELECT citus_set_coordinator_host('127.0.0.1', $1)", [ports.coordinator]);
      for (const w of ["worker1", "worker2"] as const) {
        await query(coord, "SELECT citus_add_node('127.0.0.1', $1)", [ports[w]]);
      }
      return {
        name,
        url: (node = "coordinator") => urlOf(node, name),
        async drop() {
          databases.delete(name);
          for (const node of CITUS_NODES) {
            await query(urlOf(node, "postgres"), `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(
              () => {},
            );
          }
        },
      };
    },
    async stop() {
      await Promise.all(procs.map((p) => killGroup(p.child, "SIGINT")));
      await rm(dir, { recursive: true, force: true });
    },
  };
  return cluster;
}
