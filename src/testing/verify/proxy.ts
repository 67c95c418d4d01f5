/**
 * A loopback HTTP fault proxy. It forwards each request to the target, reads the target's whole
 * reply (so the server has finished its work), and then relays that reply, drops it, or holds it.
 *
 * - `drop`: the reply is thrown away and the client's connection destroyed. The client sees a reset
 *   socket (fetch: "fetch failed", cause UND_ERR_SOCKET) although the server did the work: the lost
 *   reply that retries with a key exist for.
 * - `hold`: the reply is kept back until the client gives up and closes the connection (a per-try
 *   timeout), then thrown away; relayed after `holdMs` if the client never gives up.
 *
 * Faults are queued per idempotency key with {@link FaultProxy.inject}: the next requests carrying that
 * key take them in order; every other request is relayed. Every exchange is recorded, dropped ones
 * included, so a test can compare what the server answered with what the client got.
 */
import http, { type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from "node:http";
import https from "node:https";
import type { AddressInfo } from "node:net";

/** A fault for one request through the proxy: drop its reply, or hold it back. */
export type ProxyFault = "drop" | "hold";

/** What became of one reply. */
export const ReplyFate = {
  relayed: "relayed",
  dropped: "dropped",
  /** Held until the client gave up (timed out), then thrown away. */
  timedOut: "timed-out",
  /** The target could not be reached or did not answer: the client got a 502. */
  failed: "failed",
} as const;
/** One of the values of {@link ReplyFate}. */
export type ReplyFate = (typeof ReplyFate)[keyof typeof ReplyFate];

/** One request that went through the proxy and what the target answered. */
export interface Exchange {
  /** The idempotency key (unquoted), if the request carried one. */
  key: string | undefined;
  method: string;
  path: string;
  /** The target's status (0 when it could not be reached). */
  status: number;
  /** The target's reply body as text (UTF-8). */
  body: string;
  /** The target's `content-type` and `idempotent-replayed`, when present. */
  contentType: string | undefined;
  replayed: boolean;
  fate: ReplyFate;
  /** Milliseconds from the request's arrival to the target's complete reply. */
  serverMs: number;
}

/** Options of {@link startFaultProxy}. */
export interface FaultProxyOptions {
  /** Where requests go: `http://host:port` (or https). Required. */
  target: string;
  /** Header carrying the idempotency key. Default `Idempotency-Key`. */
  keyHeader?: string;
  /**
   * Where a request's key is read instead of `keyHeader`, given its headers and body: e.g. an MCP tool
   * call's `_meta.idempotencyKey` in its JSON-RPC body. Default: the `keyHeader` header.
   */
  keyOf?: (headers: IncomingHttpHeaders, body: Buffer) => string | undefined;
  /** Longest a `hold` keeps a reply back before relaying it anyway. Default 30,000 ms. */
  holdMs?: number;
  /** Interface to listen on. Default `127.0.0.1` (loopback only). */
  host?: string;
  /** Port. Default 0 (any free port). */
  port?: number;
  /** Longest wait for the target's complete reply before answering 502. Default 60,000 ms. */
  upstreamTimeoutMs?: number;
}

/** A running fault proxy (see {@link startFaultProxy}). */
export interface FaultProxy {
  /** The proxy's base URL, e.g. `http://127.0.0.1:53211`. */
  readonly url: string;
  /** Queue faults for the next requests that carry `key` (one fault per request, in order). */
  inject(key: string, ...faults: ProxyFault[]): void;
  /** Every exchange so far, oldest first; with `key`, only that key's. */
  exchanges(key?: string): Exchange[];
  /** Counts of replies by fate. */
  stats(): Record<ReplyFate, number>;
  /** Resolves once no request is in the proxy (every reply relayed, dropped or timed out). */
  idle(): Promise<void>;
  /** Stop listening and drop what is held. */
  close(): Promise<void>;
}

/** Headers that belong to one connection and are never forwarded (RFC 9110 §7.6.1). */
const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "transfer-encoding",
  "te",
  "trailer",
  "upgrade",
  "proxy-authorization",
  "proxy-authenticate",
]);

/** The key as sent: an RFC 8941 quoted string or a bare token. */
export function unquoteKey(raw: string | string[] | undefined): string | undefined {
  const v = Array.isArray(raw) ? raw[0] : raw;
  if (v === undefined) return undefined;
  const t = v.trim();
  return t.length >= 2 && t.startsWith('"') && t.endsWith('"') ? t.slice(1, -1).replace(/\\(.)/g, "$1") : t;
}

function forwardHeaders(
  headers: IncomingHttpHeaders,
  host: string,
  length: number,
): http.OutgoingHttpHeaders {
  const out: http.OutgoingHttpHeaders = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || HOP_BY_HOP.has(name) || name === "content-length") continue;
    out[name] = value;
  }
  out.host = host;
  if (length > 0 || headers["content-length"] !== undefined) out["content-length"] = length;
  return out;
}

/** `keyOf`'s answer; a body it cannot read (not the JSON it expects) carries no key. */
function keyFrom(
  keyOf: NonNullable<FaultProxyOptions["keyOf"]>,
  headers: IncomingHttpHeaders,
  body: Buffer,
): string | undefined {
  try {
    return keyOf(headers, body);
  } catch {
    return undefined;
  }
}

function readAll(stream: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("end", () => resolve(Buffer.concat(chunks)));
    stream.on("error", reject);
    stream.on("aborted", () => reject(new Error("aborted")));
  });
}

/**
 * Start an HTTP proxy on loopback in front of `target` that can drop or hold the replies of the
 * requests that carry a given idempotency key, and records every exchange.
 */
export async function startFaultProxy(options: FaultProxyOptions): Promise<FaultProxy> {
  const target = new URL(options.target);
  if (target.protocol !== "http:" && target.protocol !== "https:") {
    throw new Error(`the proxy's target must be an http:// or https:// URL, not ${options.target}`);
  }
  const lib = target.protocol === "https:" ? https : http;
  const agent = new lib.Agent({ keepAlive: true, maxSockets: 64 });
  const keyHeader = (options.keyHeader ?? "Idempotency-Key").toLowerCase();
  const holdMs = options.holdMs ?? 30_000;
  const upstreamTimeoutMs = options.upstreamTimeoutMs ?? 60_000;
  const basePath = target.pathname.replace(/\/$/, "");
  const queued = new Map<string, ProxyFault[]>();
  const log: Exchange[] = [];
  const counts: Record<ReplyFate, number> = { relayed: 0, dropped: 0, "timed-out": 0, failed: 0 };
  let inFlight = 0;
  let waiters: (() => void)[] = [];

  const upstream = (req: IncomingMessage, body: Buffer) =>
    new Promise<{ res: IncomingMessage; body: Buffer }>((resolve, reject) => {
      const out = lib.request(
        {
          protocol: target.protocol,
          hostname: target.hostname,
          port: target.port,
          method: req.method,
          path: basePath + (req.url ?? "/"),
          headers: forwardHeaders(req.headers, target.host, body.length),
          agent,
          timeout: upstreamTimeoutMs,
        },
        (res) => readAll(res).then((b) => resolve({ res, body: b }), reject),
      );
      out.on("timeout", () => out.destroy(new Error(`no complete reply within ${upstreamTimeoutMs} ms`)));
      out.on("error", reject);
      out.end(body);
    });

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const started = Date.now();
    // Watch the client from the start: a client that gives up while the target works is seen here.
    let clientGone = false;
    const onGone = () => {
      clientGone = true;
    };
    res.on("close", onGone);
    const entry: Exchange = {
      key: undefined,
      method: req.method ?? "GET",
      path: req.url ?? "/",
      status: 0,
      body: "",
      contentType: undefined,
      replayed: false,
      fate: ReplyFate.relayed,
      serverMs: 0,
    };
    let reply: { res: IncomingMessage; body: Buffer };
    let fault: ProxyFault | undefined;
    try {
      const body = await readAll(req);
      const key = options.keyOf
        ? keyFrom(options.keyOf, req.headers, body)
        : unquoteKey(req.headers[keyHeader]);
      entry.key = key;
      if (key !== undefined) {
        const q = queued.get(key);
        fault = q?.shift();
        if (q && q.length === 0) queued.delete(key);
      }
      reply = await upstream(req, body);
    } catch (err) {
      entry.fate = ReplyFate.failed;
      entry.serverMs = Date.now() - started;
      entry.body = String((err as Error).message);
      log.push(entry);
      counts.failed++;
      if (!clientGone && !res.headersSent) {
        res.writeHead(502, { "content-type": "text/plain" });
        res.end(`idem fault proxy: the target did not answer (${(err as Error).message})\n`);
      }
      return;
    }
    entry.serverMs = Date.now() - started;
    entry.status = reply.res.statusCode ?? 0;
    entry.body = reply.body.toString("utf8");
    entry.contentType = reply.res.headers["content-type"];
    entry.replayed = String(reply.res.headers["idempotent-replayed"] ?? "").toLowerCase() === "true";
    log.push(entry);

    if (fault === "hold" && !clientGone) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, holdMs);
        res.once("close", () => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
    if (fault === "drop") {
      entry.fate = ReplyFate.dropped;
      counts.dropped++;
      req.socket.destroy();
      return;
    }
    if (clientGone) {
      entry.fate = ReplyFate.timedOut;
      counts["timed-out"]++;
      return;
    }
    const headers: http.OutgoingHttpHeaders = {};
    for (const [name, value] of Object.entries(reply.res.headers)) {
      if (value !== undefined && !HOP_BY_HOP.has(name) && name !== "content-length") headers[name] = value;
    }
    headers["content-length"] = reply.body.length;
    counts.relayed++;
    res.writeHead(reply.res.statusCode ?? 502, reply.res.statusMessage, headers);
    res.end(reply.body);
  }

  const server = http.createServer((req, res) => {
    inFlight++;
    handle(req, res)
      .catch(() => {
        if (!res.headersSent) res.writeHead(502);
        res.end();
      })
      .finally(() => {
        if (--inFlight === 0) {
          for (const w of waiters) w();
          waiters = [];
        }
      });
  });
  server.keepAliveTimeout = 5_000;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 0, options.host ?? "127.0.0.1", () => {
      server.off("error", reject);
      resolve();
    });
  });
  const { address, port } = server.address() as AddressInfo;
  const host = address.includes(":") ? `[${address}]` : address;

  return {
    url: `http://${host}:${port}`,
    inject(key, ...faults) {
      const q = queued.get(key) ?? [];
      q.push(...faults);
      queued.set(key, q);
    },
    exchanges(key) {
      return key === undefined ? [...log] : log.filter((e) => e.key === key);
    },
    stats: () => ({ ...counts }),
    idle: () => (inFlight === 0 ? Promise.resolve() : new Promise<void>((r) => waiters.push(r))),
    close() {
      agent.destroy();
      server.closeAllConnections();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
