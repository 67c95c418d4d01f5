/**
 * A failover front for the chaos test: what a load balancer in front of several instances of the
 * service does when one is SIGKILLed. Each request goes to the next instance in turn; an instance
 * that refuses the connection (it is down) is skipped, so a request that was never sent is sent to
 * another one, and so is one whose pooled keep-alive connection was reset before any reply (the
 * instance closed it as idle, or was killed: Node's documented keep-alive race; balancers such as
 * Envoy retry these too, and the key makes a second delivery harmless). A request that was sent on a
 * fresh connection to an instance that then died is answered 502: the client retries with its key.
 * When every instance refuses, 502.
 *
 * Request bodies are buffered (the chaos test sends small JSON); responses are streamed back.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";

export interface Failover {
  url: string;
  /** Requests sent to another instance because the first one tried refused the connection. */
  failedOver(): number;
  close(): Promise<void>;
}

/** The instance is down: nothing was sent, another one may take the request. */
const REFUSED = new Set(["ECONNREFUSED"]);

export async function startFailover(targets: () => readonly string[]): Promise<Failover> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });
  let next = 0;
  let failedOver = 0;

  const forward = (
    target: string,
    req: http.IncomingMessage,
    body: Buffer,
    res: http.ServerResponse,
  ): Promise<"sent" | "refused"> =>
    new Promise((resolve) => {
      const url = new URL(req.url ?? "/", target);
      const headers = { ...req.headers, host: url.host, "content-length": String(body.length) };
      delete headers["transfer-encoding"];
      const up = http.request(url, { method: req.method, headers, agent }, (upRes) => {
        res.writeHead(upRes.statusCode ?? 502, upRes.statusMessage, upRes.headers);
        upRes.pipe(res);
        upRes.on("error", () => res.destroy());
        upRes.on("end", () => resolve("sent"));
        upRes.on("aborted", () => {
          res.destroy();
          resolve("sent");
        });
      });
      up.on("error", (err: NodeJS.ErrnoException) => {
        if (REFUSED.has(err.code ?? "")) return resolve("refused");
        if (up.reusedSocket && err.code === "ECONNRESET" && !res.headersSent) return resolve("refused");
        // Sent, then the instance died: the outcome is unknown to us, as to any balancer.
        if (!res.headersSent) res.writeHead(502, { "content-type": "text/plain" }).end("instance died");
        else res.destroy();
        resolve("sent");
      });
      up.end(body);
    });

  const server = http.createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = Buffer.concat(chunks);
    const list = targets();
    const first = next++ % list.length;
    for (let i = 0; i < list.length; i++) {
      if ((await forward(list[(first + i) % list.length]!, req, body, res)) === "sent") {
        if (i > 0) failedOver++;
        return;
      }
    }
    res.writeHead(502, { "content-type": "text/plain" }).end("no instance is up");
  });
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    failedOver: () => failedOver,
    async close() {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
      agent.destroy();
    },
  };
}
