/**
 * The service's HTTP server: limits that keep one client from exhausting the process, a clear error
 * for a port that is taken, and a drain on shutdown. The limits come from the environment through
 * app/config.ts (IDEM_HTTP_*, IDEM_DRAIN_MS).
 */
import type { Server } from "node:http";
import { type ServerType, serve } from "@hono/node-server";

export interface HttpLimits {
  headersTimeoutMs: number;
  requestTimeoutMs: number;
  keepAliveTimeoutMs: number;
  idleTimeoutMs: number;
  maxConnections: number;
  drainMs: number;
}

export const DEFAULT_LIMITS: HttpLimits = {
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 15_000,
  keepAliveTimeoutMs: 5_000,
  idleTimeoutMs: 60_000,
  maxConnections: 1_000,
  drainMs: 10_000,
};

/** An error for a port that is taken, naming the setting to change. */
export function portInUse(err: unknown, port: number, setting: string): Error {
  if ((err as { code?: string })?.code === "EADDRINUSE") {
    return new Error(
      `port ${port} is already in use: stop what listens there, or set ${setting} to another port`,
    );
  }
  return err as Error;
}

/** Serve `fetch` on host:port with the limits; resolves once it listens (or rejects naming `setting`). */
export async function listen(
  fetch: (request: Request) => Response | Promise<Response>,
  o: { port: number; host: string; limits: HttpLimits; setting: string },
): Promise<Server> {
  const server = serve({
    fetch,
    port: o.port,
    hostname: o.host,
    serverOptions: {
      headersTimeout: o.limits.headersTimeoutMs,
      requestTimeout: o.limits.requestTimeoutMs,
      keepAliveTimeout: o.limits.keepAliveTimeoutMs,
      connectionsCheckingInterval: Math.min(1_000, o.limits.headersTimeoutMs, o.limits.requestTimeoutMs),
    },
  }) as ServerType as Server;
  server.maxConnections = o.limits.maxConnections;
  server.setTimeout(o.limits.idleTimeoutMs, (socket) => socket.destroy());
  await new Promise<void>((resolve, reject) => {
    server.once("listening", () => resolve());
    server.once("error", (err) => reject(portInUse(err, o.port, o.setting)));
  });
  return server;
}

/**
 * Stop accepting, close idle keep-alive connections, and let requests in flight finish for up to
 * `drainMs`; connections still open then are closed. Resolves with how many were cut.
 */
export async function drain(server: Server, drainMs: number): Promise<{ cut: number }> {
  const closed = new Promise<void>((resolve) => server.close(() => resolve()));
  server.closeIdleConnections();
  let cut = 0;
  const timer = setTimeout(() => {
    server.getConnections((_err, open) => {
      cut = open ?? 0;
      server.closeAllConnections();
    });
  }, drainMs);
  timer.unref();
  await closed;
  clearTimeout(timer);
  return { cut };
}
