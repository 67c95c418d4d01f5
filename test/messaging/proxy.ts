/**
 * A loopback TCP proxy that a test can sever: every open connection is destroyed at once (both ends
 * see a reset), as when a broker or the network between goes away mid-batch. New connections go
 * through again unless `refuse` is set. Written here (node:net, a few lines) because the tests need
 * to cut at an exact moment from inside the process, which an external tool like toxiproxy would
 * only add a moving part to.
 */
import net from "node:net";

export interface CuttableProxy {
  /** `host:port` to give the client instead of the broker's. */
  readonly port: number;
  /** Connections cut so far. */
  readonly cuts: number;
  /** Destroy every open connection now. */
  cut(): void;
  /** While true, new connections are closed at once (the broker looks down). */
  refuse: boolean;
  /** Bytes forwarded client -> broker so far (to cut "mid-batch"). */
  readonly bytesUp: number;
  /** Client connections open through the proxy now. */
  readonly open: number;
  close(): Promise<void>;
}

export async function startProxy(target: { host: string; port: number }): Promise<CuttableProxy> {
  const sockets = new Set<net.Socket>();
  let cuts = 0;
  let bytesUp = 0;
  const server = net.createServer((client) => {
    if (proxy.refuse) {
      client.destroy();
      return;
    }
    const upstream = net.connect(target.port, target.host);
    sockets.add(client);
    sockets.add(upstream);
    client.on("data", (chunk) => {
      bytesUp += chunk.length;
    });
    client.pipe(upstream);
    upstream.pipe(client);
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on("error", end);
    upstream.on("error", end);
    client.on("close", end);
    upstream.on("close", end);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const proxy: CuttableProxy = {
    port: (server.address() as net.AddressInfo).port,
    get cuts() {
      return cuts;
    },
    get bytesUp() {
      return bytesUp;
    },
    get open() {
      return sockets.size / 2;
    },
    refuse: false,
    cut() {
      cuts++;
      for (const s of sockets) s.resetAndDestroy();
      sockets.clear();
    },
    async close() {
      proxy.cut();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  return proxy;
}
