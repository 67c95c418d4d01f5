/**
 * A 3-node NATS JetStream cluster on loopback for one test: three `nats-server` processes with their
 * own temporary store directories, routed to each other, on free ports. `kill(i)` is a kill -9 of one
 * node; `restart(i)` starts it again on the same ports and store (it catches up from the others).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const NATS_SERVER = process.env.NATS_SERVER_BIN ?? "/usr/sbin/nats-server";
export const hasNatsServer = existsSync(NATS_SERVER);

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

async function listening(port: number, ms: number): Promise<void> {
  const end = Date.now() + ms;
  for (;;) {
    const ok = await new Promise<boolean>((resolve) => {
      const c = net.connect(port, "127.0.0.1");
      c.once("connect", () => {
        c.destroy();
        resolve(true);
      });
      c.once("error", () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > end) throw new Error(`nats-server on port ${port} did not start within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export interface NatsCluster {
  /** Client URLs of the three nodes. */
  readonly urls: string[];
  /** Server names: `n0`, `n1`, `n2`. */
  readonly names: string[];
  /** kill -9 node `i`. */
  kill(i: number): void;
  /** Start node `i` again (same ports, same store), once it is down. */
  restart(i: number): Promise<void>;
  /** Stop every node and remove the store directories. */
  stop(): Promise<void>;
}

export async function startNatsCluster(): Promise<NatsCluster> {
  const dir = await mkdtemp(join(tmpdir(), "idem-nats-cluster-"));
  const clientPorts = [await freePort(), await freePort(), await freePort()];
  const routePorts = [await freePort(), await freePort(), await freePort()];
  const names = ["n0", "n1", "n2"];
  const procs: (ChildProcess | undefined)[] = [undefined, undefined, undefined];
  const exited: Promise<void>[] = [Promise.resolve(), Promise.resolve(), Promise.resolve()];
  const start = async (i: number) => {
    const routes = routePorts
      .filter((_, j) => j !== i)
      .map((p) => `nats-route://127.0.0.1:${p}`)
      .join(",");
    const p = spawn(
      NATS_SERVER,
      [
        "--jetstream",
        "--store_dir",
        join(dir, names[i]!),
        "--server_name",
        names[i]!,
        "--cluster_name",
        "idem-test",
        "--addr",
        "127.0.0.1",
        "--port",
        String(clientPorts[i]),
        "--cluster",
        `nats://127.0.0.1:${routePorts[i]}`,
        "--routes",
        routes,
      ],
      { stdio: "ignore" },
    );
    procs[i] = p;
    exited[i] = new Promise((r) => p.once("exit", () => r()));
    await listening(clientPorts[i]!, 10_000);
  };
  await Promise.all([0, 1, 2].map(start));
  return {
    urls: clientPorts.map((p) => `nats://127.0.0.1:${p}`),
    names,
    kill(i) {
      procs[i]?.kill("SIGKILL");
    },
    async restart(i) {
      await exited[i];
      await start(i);
    },
    async stop() {
      for (const p of procs) p?.kill("SIGKILL");
      await Promise.all(exited);
      await rm(dir, { recursive: true, force: true });
    },
  };
}
