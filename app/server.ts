/**
 * The service's HTTP server: limits that keep one client from exhausting the process, a clear error
 * for a port that is taken, and a drain on shutdown.
 *
 * Limits (environment, all optional, milliseconds unless said):
 *   IDEM_HTTP_HEADERS_TIMEOUT_MS     a request's headers must arrive within this (default 10,000)
 *   IDEM_HTTP_REQUEST_TIMEOUT_MS     the whole request must arrive within this (default 15,000); a socket that
 *                                    never sends a byte is closed (with a 408) after it too. The handler's own
 *                                    time is not counted.
 *   IDEM_HTTP_KEEPALIVE_TIMEOUT_MS   an idle keep-alive connection is closed after this (default 5,000)
 *   IDEM_HTTP_IDLE_TIMEOUT_MS        any socket with no traffic for this long is closed (default 60,000)
 *   IDEM_HTTP_MAX_CONNECTIONS        open connections at most; further ones are refused (default 1,000)
 *   IDEM_DRAIN_MS                    on SIGTERM/SIGINT, in-flight requests get this long to finish (default 10,000)
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

const ENV: Record<keyof HttpLimits, string> = {
  headersTimeoutMs: "IDEM_HTTP_HEADERS_TIMEOUT_MS",
  requestTimeoutMs: "IDEM_HTTP_REQUEST_TIMEOUT_MS",
  keepAliveTimeoutMs: "IDEM_HTTP_KEEPALIVE_TIMEOUT_MS",
  idleTimeoutMs: "IDEM_HTTP_IDLE_TIMEOUT_MS",
  maxConnections: "IDEM_HTTP_MAX_CONNECTIONS",
  drainMs: "IDEM_DRAIN_MS",
};

/** The limits from the environment; a value that is not a whole number >= 1 is a start-up error naming it. */
export function httpLimitsFromEnv(env: NodeJS.ProcessEnv): HttpLimits {
  const limits = { ...DEFAULT_LIMITS };
  for (const name of Object.keys(ENV) as (keyof HttpLimits)[]) {
    const raw = env[ENV[name]];
    if (raw === undefined || raw === "") continue;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < 1)
      throw new Error(`${ENV[name]} must be a whole number >= 1, got ${raw}`);
    limits[name] = n;
  }
  return limits;
}

/** A port from the environment: a usage error naming the variable when it is not 0..65535. */
export function portFrom(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const raw = env[name];
  const port = raw === undefined || raw === "" ? fallback : Number(raw);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    throw new Error(`${name} must be a port number from 0 to 65535, got ${raw}`);
  }
  return port;
}

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
