/**
 * A private high-availability PostgreSQL, as production teams run it: etcd (Debian's etcd-server),
 * PostgreSQL nodes managed by Patroni (Debian's patroni), and HAProxy (Debian's haproxy) sending
 * connections to whichever node Patroni's REST API says is the primary (`GET /primary`). Loopback ports
 * in the IDEM_INFRA_PORT_BASE range, one directory, everything stopped and deleted by `stop()`.
 *
 * Patroni settings (short, for a test; see docs/operations.md for production): ttl 10 s, loop_wait 1 s,
 * retry_timeout 4 s: a primary that dies is replaced once its leader key expires, about 10 s later.
 * synchronous_mode: a commit waits for the replica, so that a failover loses no answered payment
 * (with asynchronous replication the first run lost 23 of 4,533 answered payments).
 */
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import pg from "pg";
import { postgresBinDir } from "../helpers/cluster.ts";
import { daemon, findBinary, giveToPostgres, infraDir, infraPorts, killGroup, waitFor } from "./common.ts";

type Proc = ReturnType<typeof daemon>;

export interface PatroniNode {
  name: string;
  pgPort: number;
  restPort: number;
  dataDir: string;
  proc: Proc;
}

export interface PatroniCluster {
  /** postgres://postgres@127.0.0.1:<haproxy>/postgres: always the primary, through HAProxy. */
  url: string;
  /** Every live node's PostgreSQL port (for a multi-host URL). */
  nodes(): PatroniNode[];
  /** The node Patroni's REST API calls primary now. */
  primary(): Promise<PatroniNode>;
  /** Start one more node (a replica cloned from the primary) and wait until it streams as the synchronous standby. */
  addNode(): Promise<PatroniNode>;
  /** kill -9 the node: Patroni, its postmaster and every backend. */
  kill(node: PatroniNode): Promise<void>;
  /** A planned switchover from the primary to `candidate`, through Patroni's REST API. */
  switchover(candidate: PatroniNode): Promise<void>;
  stop(): Promise<void>;
}

export function patroniMissing(): Record<string, string[]> {
  return { patroni: ["patroni"], "etcd-server": ["etcd"], haproxy: ["haproxy"] };
}

export async function startPatroni(): Promise<PatroniCluster> {
  const bin = postgresBinDir();
  if (!bin) throw new Error("no PostgreSQL server binaries");
  const dir = await infraDir("patroni");
  const [etcdClient, etcdPeer, haPort] = await infraPorts(3);
  const etcd = daemon(findBinary("etcd")!, [
    "--name",
    "e1",
    "--data-dir",
    join(dir, "etcd"),
    "--listen-client-urls",
    `http://127.0.0.1:${etcdClient}`,
    "--advertise-client-urls",
    `http://127.0.0.1:${etcdClient}`,
    "--listen-peer-urls",
    `http://127.0.0.1:${etcdPeer}`,
    "--initial-advertise-peer-urls",
    `http://127.0.0.1:${etcdPeer}`,
    "--initial-cluster",
    `e1=http://127.0.0.1:${etcdPeer}`,
  ]);
  await waitFor("etcd", async () =>
    (await fetch(`http://127.0.0.1:${etcdClient}/health`)).ok ? true : undefined,
  );

  const nodes: PatroniNode[] = [];
  let count = 0;
  let haproxy: Proc | undefined;

  const restOk = async (node: PatroniNode, path: string) => {
    try {
      return (await fetch(`http://127.0.0.1:${node.restPort}${path}`, { signal: AbortSignal.timeout(2_000) }))
        .ok;
    } catch {
      return false;
    }
  };

  const writeHaproxy = async () => {
    const servers = nodes
      .map((n) => `  server ${n.name} 127.0.0.1:${n.pgPort} check port ${n.restPort}`)
      .join("\n");
    await writeFile(
      join(dir, "haproxy.cfg"),
      `global
  maxconn 500
defaults
  mode tcp
  timeout connect 2s
  timeout client 30m
  timeout server 30m
  timeout check 1s
listen primary
  bind 127.0.0.1:${haPort}
  option httpchk GET /primary
  http-check expect status 200
  default-server inter 500ms fall 2 rise 2 on-marked-down shutdown-sessions
${servers}
`,
    );
  };

  const startNode = async (): Promise<PatroniNode> => {
    const name = `n${++count}`;
    const [pgPort = 0, restPort = 0] = await infraPorts(2);
    const dataDir = join(dir, name);
    const conf = join(dir, `${name}.yml`);
    await writeFile(
      conf,
      `scope: idem
name: ${name}
restapi:
  listen: 127.0.0.1:${restPort}
  connect_address: 127.0.0.1:${restPort}
etcd3:
  hosts: 127.0.0.1:${etcdClient}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: false
      parameters:
        max_connections: 100
        wal_keep_size: 128MB
  initdb:
    - encoding: UTF8
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:${pgPort}
  connect_address: 127.0.0.1:${pgPort}
  data_dir: ${dataDir}
  bin_dir: ${bin}
  pgpass: ${join(dir, `${name}.pgpass`)}
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
  parameters:
    unix_socket_directories: '${dir}'
    fsync: 'off'
    synchronous_commit: 'on'
    shared_buffers: 32MB
`,
    );
    await giveToPostgres(conf);
    const proc = daemon(findBinary("patroni")!, [conf], { asPostgres: true });
    const node = { name, pgPort, restPort, dataDir, proc };
    nodes.push(node);
    await waitFor(
      `Patroni node ${name}`,
      async () => ((await restOk(node, "/health")) ? true : undefined),
      90_000,
      300,
    ).catch((err) => {
      throw new Error(`${(err as Error).message}\n${proc.output().slice(-3_000)}`);
    });
    return node;
  };

  const reloadHaproxy = async () => {
    await writeHaproxy();
    if (haproxy) await killGroup(haproxy.child, "SIGKILL");
    haproxy = daemon(findBinary("haproxy")!, ["-f", join(dir, "haproxy.cfg"), "-db"]);
    // HAProxy counts every server up until its first checks fail (fall 2 x 500 ms): wait them out.
    await new Promise((r) => setTimeout(r, 2_000));
    await waitFor("HAProxy to the primary", async () => {
      const c = new pg.Client({ connectionString: cluster.url, connectionTimeoutMillis: 2_000 });
      c.on("error", () => {});
      try {
        await c.connect();
        const { rows } = await c.query("SELECT pg_is_in_recovery() AS standby");
        return rows[0].standby ? undefined : true;
      } finally {
        await c.end().catch(() => {});
      }
    });
  };

  const cluster: PatroniCluster = {
    url: `postgres://postgres@127.0.0.1:${haPort}/postgres`,
    nodes: () => [...nodes],
    async primary() {
      return waitFor("a primary", async () => {
        for (const n of nodes) if (await restOk(n, "/primary")) return n;
        return undefined;
      });
    },
    async addNode() {
      const node = await startNode();
      // In synchronous mode Patroni promotes only the synchronous standby: a replica that streams but
      // is not yet named in the cluster's sync key could not take over, and losing the primary then
      // would leave no primary at all. So the node counts once Patroni says it is the sync standby.
      await waitFor(
        `${node.name} streaming as the synchronous standby`,
        async () => ((await restOk(node, "/replica")) && (await restOk(node, "/sync")) ? true : undefined),
        90_000,
        300,
      );
      return node;
    },
    async kill(node) {
      const pidFile = join(node.dataDir, "postmaster.pid");
      const postmaster = existsSync(pidFile) ? Number(readFileSync(pidFile, "utf8").split("\n")[0]) : 0;
      await killGroup(node.proc.child, "SIGKILL", 1_000);
      if (postmaster) {
        for (const target of [-postmaster, postmaster]) {
          try {
            process.kill(target, "SIGKILL");
          } catch {
            // not a group, or gone
          }
        }
        // Backends notice their postmaster's death on their own; make sure none lingers.
        try {
          execFileSync("pkill", ["-9", "-P", String(postmaster)], { stdio: "ignore" });
        } catch {
          // none left
        }
      }
      nodes.splice(nodes.indexOf(node), 1);
    },
    async switchover(candidate) {
      const leader = await cluster.primary();
      const res = await fetch(`http://127.0.0.1:${leader.restPort}/switchover`, {
        method: "POST",
        body: JSON.stringify({ leader: leader.name, candidate: candidate.name }),
      });
      if (!res.ok) throw new Error(`switchover refused: ${res.status} ${await res.text()}`);
    },
    async stop() {
      if (haproxy) await killGroup(haproxy.child, "SIGKILL");
      for (const n of [...nodes]) await cluster.kill(n);
      await killGroup(etcd.child, "SIGKILL");
      await rm(dir, { recursive: true, force: true });
    },
  };

  try {
    const first = await startNode();
    await waitFor(
      "the first primary",
      async () => ((await restOk(first, "/primary")) ? true : undefined),
      90_000,
    );
    await cluster.addNode();
    await reloadHaproxy();
    // HAProxy learns the nodes of its configuration only: nodes added later are appended and it is
    // started again (a test-only shortcut for a reload).
    const addNode = cluster.addNode;
    cluster.addNode = async () => {
      const node = await addNode();
      await reloadHaproxy();
      return node;
    };
    return cluster;
  } catch (err) {
    await cluster.stop();
    throw new Error(`${(err as Error).message}\netcd: ${etcd.output().slice(-2_000)}`);
  }
}
