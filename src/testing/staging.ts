/**
 * Staging fault injection for a whole service: drop a share of replies AFTER the server did the work
 * (the client sees a cut connection, the work is committed), delay some, and deliver some requests
 * twice. What a flaky network does to clients, on purpose, so that retries, keys and replays are
 * exercised by real traffic before production does it by accident.
 *
 *   // a fetch handler (Hono, Bun, Deno, workers):
 *   serve({ fetch: stagingFaults.fetch(app.fetch, { enabled: true, dropReply: 0.1, delay: 0.05 }) });
 *   // a node:http listener (Express, Fastify's server, idem/node):
 *   createServer(stagingFaults.listener(app, { enabled: true, duplicate: 0.02 }));
 *
 * Off unless `enabled: true` (the handler is returned unchanged), and it refuses to start when
 * NODE_ENV=production. Framework-free: it only wraps the handler.
 */

import { randomInt } from "node:crypto";
import { type IncomingMessage, type RequestListener, request, type ServerResponse } from "node:http";
import { createRng } from "./prng.ts";

/** Options of `stagingFaults`: off unless `enabled`, and the share of each fault. */
export interface StagingFaultOptions {
  /** Must be `true` for anything to happen. Default: false (the handler is returned as it is). */
  enabled?: boolean;
  /** Share (0..1) of replies dropped after the handler finished: the work is done, the reply lost. */
  dropReply?: number;
  /** Share (0..1) of replies delayed by `delayMs`. */
  delay?: number;
  /** How long a delayed reply waits, in ms: a number or `[min, max]`. Default: `[500, 3000]`. */
  delayMs?: number | readonly [number, number];
  /** Share (0..1) of requests delivered twice (the copy's reply is thrown away). */
  duplicate?: number;
  /** Only requests for which this returns true are faulted. Default: every POST, PUT, PATCH and DELETE. */
  only?: (request: { method: string; url: string; headers: Headers }) => boolean;
  /** Seed of the draws (same seed, same faults). Default: random. */
  seed?: number;
  /** Told of every fault injected (logs, metrics). */
  onFault?: (event: { fault: "drop-reply" | "delay" | "duplicate"; method: string; url: string }) => void;
  /** The environment checked for NODE_ENV. Default: `process.env`. */
  env?: Record<string, string | undefined>;
}

/** Staging faults were asked for in production. */
export class StagingFaultsInProductionError extends Error {
  /** Always `"StagingFaultsInProductionError"`: the name logs and stack traces show. */
  override name = "StagingFaultsInProductionError";
  constructor() {
    super("staging faults refuse to start with NODE_ENV=production: they drop replies on purpose");
  }
}

type Fault = { drop: boolean; delayMs: number; duplicate: boolean };

function planner(o: StagingFaultOptions) {
  if ((o.env ?? process.env).NODE_ENV === "production") throw new StagingFaultsInProductionError();
  for (const [name, v] of Object.entries({
    dropReply: o.dropReply,
    delay: o.delay,
    duplicate: o.duplicate,
  })) {
    if (v !== undefined && !(v >= 0 && v <= 1))
      throw new RangeError(`stagingFaults: ${name} is a share, 0 to 1`);
  }
  const rng = createRng(o.seed ?? randomInt(1, 2 ** 31));
  const [min, max] = typeof o.delayMs === "number" ? [o.delayMs, o.delayMs] : (o.delayMs ?? [500, 3_000]);
  const only = o.only ?? ((r) => r.method !== "GET" && r.method !== "HEAD" && r.method !== "OPTIONS");
  return (method: string, url: string, headers: Headers): Fault | undefined => {
    if (!only({ method, url, headers })) return undefined;
    // One draw per fault kind, in a fixed order, so a seed gives the same sequence.
    const fault: Fault = {
      drop: rng.chance(o.dropReply ?? 0),
      delayMs: rng.chance(o.delay ?? 0) ? min + rng.int(Math.max(0, max - min) + 1) : 0,
      duplicate: rng.chance(o.duplicate ?? 0),
    };
    if (!fault.drop && fault.delayMs === 0 && !fault.duplicate) return undefined;
    if (fault.duplicate) o.onFault?.({ fault: "duplicate", method, url });
    if (fault.delayMs > 0) o.onFault?.({ fault: "delay", method, url });
    if (fault.drop) o.onFault?.({ fault: "drop-reply", method, url });
    return fault;
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A body whose stream fails: the server adapter cuts the connection, so the client gets no reply. */
function cut(status: number): Response {
  return new Response(
    new ReadableStream({
      start(c) {
        c.error(new Error("reply dropped by staging faults"));
      },
    }),
    { status },
  );
}

/** Wrap a fetch handler `(request) => Response`. */
function fetchFaults<A extends unknown[]>(
  handler: (request: Request, ...rest: A) => Response | Promise<Response>,
  options: StagingFaultOptions,
): (request: Request, ...rest: A) => Promise<Response> {
  if (!options.enabled) return async (req, ...rest) => handler(req, ...rest);
  const plan = planner(options);
  return async (req, ...rest) => {
    const fault = plan(req.method, req.url, req.headers);
    if (!fault) return handler(req, ...rest);
    if (fault.duplicate) {
      const copy = req.clone();
      // The copy arrives too (as a network duplicate would); its reply goes nowhere.
      void Promise.resolve()
        .then(() => handler(copy, ...rest))
        .then((r) => r.body?.cancel())
        .catch(() => {});
    }
    const res = await handler(req, ...rest);
    if (fault.delayMs > 0) await sleep(fault.delayMs);
    if (!fault.drop) return res;
    await res.arrayBuffer().catch(() => {}); // the server finished its reply; then it is lost
    return cut(res.status);
  };
}

/** The marker on the copies a listener sends itself (they are never faulted again). */
const SELF = "x-idem-staging-fault-copy";

function headersOf(req: IncomingMessage): Headers {
  const h = new Headers();
  for (const [name, value] of Object.entries(req.headers)) {
    if (value === undefined) continue;
    for (const v of Array.isArray(value) ? value : [value]) h.append(name, v);
  }
  return h;
}

/** Send a copy of the request to this same server over loopback; resolve with its whole reply. */
function sendToSelf(
  req: IncomingMessage,
  body: Buffer,
): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: Buffer }> {
  const address = req.socket.localAddress ?? "127.0.0.1";
  const host = address.includes(":") ? address.replace(/^::ffff:/, "") : address;
  return new Promise((resolve, reject) => {
    const r = request(
      {
        host: host.includes(":") ? `[${host}]` : host,
        port: req.socket.localPort,
        method: req.method,
        path: req.url,
        headers: {
          ...Object.fromEntries(Object.entries(req.headers).filter(([n]) => n !== "transfer-encoding")),
          [SELF]: "1",
          "content-length": String(body.length),
          connection: "close",
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("error", reject);
        res.on("end", () =>
          resolve({ status: res.statusCode ?? 502, headers: res.headers, body: Buffer.concat(chunks) }),
        );
      },
    );
    r.on("error", reject);
    r.end(body);
  });
}

/**
 * Wrap a node:http listener. A faulted request is read whole and sent to this same server over
 * loopback (twice for a duplicate), so the application sees real requests whatever its framework;
 * the reply then reaches the client late, or never (the socket is cut after the work is done).
 */
function listenerFaults(listener: RequestListener, options: StagingFaultOptions): RequestListener {
  if (!options.enabled) return listener;
  const plan = planner(options);
  return (req: IncomingMessage, res: ServerResponse) => {
    if (req.headers[SELF] !== undefined) {
      delete req.headers[SELF];
      return listener(req, res);
    }
    const fault = plan(req.method ?? "GET", req.url ?? "/", headersOf(req));
    if (!fault) return listener(req, res);
    void (async () => {
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      const body = Buffer.concat(chunks);
      const first = sendToSelf(req, body);
      if (fault.duplicate) void sendToSelf(req, body).catch(() => {});
      const reply = await first;
      if (fault.delayMs > 0) await sleep(fault.delayMs);
      if (fault.drop) return void req.socket.destroy();
      const headers = { ...reply.headers };
      delete headers.connection;
      delete headers["transfer-encoding"];
      res.writeHead(reply.status, { ...headers, "content-length": String(reply.body.length) });
      res.end(reply.body);
    })().catch(() => {
      if (!res.headersSent) res.writeHead(502).end();
      else res.destroy();
    });
  };
}

/** Staging fault wrappers: `stagingFaults.fetch(handler, options)`, `stagingFaults.listener(listener, options)`. */
export interface StagingFaults {
  /** Wrap a fetch handler `(request, ...rest) => Response`. */
  fetch<A extends unknown[]>(
    handler: (request: Request, ...rest: A) => Response | Promise<Response>,
    options: StagingFaultOptions,
  ): (request: Request, ...rest: A) => Promise<Response>;
  /**
   * Wrap a node:http listener: a faulted request is sent to the same server again over loopback (twice
   * for a duplicate), and its reply reaches the client late, or never.
   */
  listener(listener: RequestListener, options: StagingFaultOptions): RequestListener;
}

export const stagingFaults: StagingFaults = { fetch: fetchFaults, listener: listenerFaults };

/**
 * Options from the environment, for a service to switch faults on in staging without a code change:
 * `IDEM_STAGING_FAULTS="drop=0.1,delay=0.05,duplicate=0.02"` (absent or empty: off).
 */
export function stagingFaultsFromEnv(
  env: Record<string, string | undefined> = process.env,
): StagingFaultOptions {
  const spec = env.IDEM_STAGING_FAULTS?.trim();
  if (!spec) return { enabled: false };
  const options: StagingFaultOptions = { enabled: true, env };
  for (const part of spec.split(",")) {
    const [name, value] = part.split("=").map((s) => s.trim());
    const share = Number(value);
    if (name === "drop") options.dropReply = share;
    else if (name === "delay") options.delay = share;
    else if (name === "duplicate") options.duplicate = share;
    else throw new Error(`IDEM_STAGING_FAULTS: unknown fault "${name}" (drop, delay, duplicate)`);
  }
  return options;
}
