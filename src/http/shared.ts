/**
 * What the adapters share on Node's HTTP objects: reading a body with a limit, flattening headers,
 * noticing a client that hung up, and writing a `StoredResponse`. Written once here; the adapters
 * (hono.ts, express.ts, fastify.ts, node.ts) import from this file, never from each other.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Socket } from "node:net";
import type { HangUp, IdemRequest } from "../core/index.ts";
import { IdemError, ProblemCode, type StoredResponse } from "../core/index.ts";
import { installTelemetry } from "../observability/install.ts";
import { NULL_BODY_STATUSES } from "./fetch.ts";

// Spans and metrics for every adapter's keyed requests (and the store, client and relay of the same
// process), when @opentelemetry/api is installed.
installTelemetry();

export const DEFAULT_BODY_LIMIT = 1024 * 1024;

/** Read a whole request body, rejecting with a 413 `IdemError` past `limit` bytes. */
export function readBody(req: IncomingMessage, limit: number = DEFAULT_BODY_LIMIT): Promise<Buffer> {
  const tooLarge = () =>
    new IdemError(ProblemCode.BodyTooLarge, 413, `The request body is larger than ${limit} bytes.`);
  if (Number(req.headers["content-length"]) > limit) return Promise.reject(tooLarge());
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const done = (err?: unknown) => {
      req.off("data", onData).off("end", onEnd).off("error", done).off("close", onClose);
      if (err) {
        req.resume(); // discard the rest; Node answers on this connection once it is read
        reject(err);
      } else resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size));
    };
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) done(tooLarge());
      else chunks.push(chunk);
    };
    const onEnd = () => done();
    const onClose = () => done(new Error("the client closed the connection while sending the body"));
    req.on("data", onData).on("end", onEnd).on("error", done).on("close", onClose);
  });
}

/**
 * Whether the client went away before the response was sent, read from the socket only when the store
 * asks (just before its commit): no AbortController and no listener per request.
 */
export class SocketHangUp implements HangUp {
  constructor(
    private readonly socket: Socket | null | undefined,
    private readonly res?: ServerResponse,
  ) {}
  get aborted(): boolean {
    if (this.res?.writableFinished) return false;
    return this.socket ? this.socket.destroyed : false;
  }
}

/** Header pairs grouped by lower-case name, so repeated headers (Set-Cookie) are sent once per value. */
export function groupHeaders(headers: Iterable<readonly [string, string]>): Map<string, string[]> {
  const grouped = new Map<string, string[]>();
  for (const [k, v] of headers) {
    const name = k.toLowerCase();
    const values = grouped.get(name);
    if (values) values.push(v);
    else grouped.set(name, [v]);
  }
  return grouped;
}

/** Node's header object (`getHeaders()`, `req.headers`) as lower-case name/value pairs, one per value. */
export function headerPairs(
  headers: Record<string, number | string | readonly string[] | undefined>,
): Array<[string, string]> {
  const pairs: Array<[string, string]> = [];
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined) continue;
    if (typeof value === "object") for (const one of value) pairs.push([name.toLowerCase(), one]);
    else pairs.push([name.toLowerCase(), String(value)]);
  }
  return pairs;
}

/** A header of a Node request as one string (repeated headers joined with ", "). */
export function headerOf(req: IncomingMessage, name: string): string | undefined {
  const v = req.headers[name.toLowerCase()];
  return Array.isArray(v) ? v.join(", ") : v;
}

/** Bytes as a Buffer over the same memory (Fastify sends Buffers as they are, and refuses a bare Uint8Array). */
export function bufferOf(body: Uint8Array): Buffer {
  return Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}

/** Send a response as the lifecycle returned it. */
export function writeResponse(res: ServerResponse, r: StoredResponse): void {
  const headers = r.headers;
  if (hasRepeatedName(headers)) {
    for (const [name, values] of groupHeaders(headers)) {
      res.setHeader(name, values.length === 1 ? values[0]! : values);
    }
  } else for (const [name, value] of headers) res.setHeader(name, value);
  res.statusCode = r.status;
  res.end(NULL_BODY_STATUSES.has(r.status) || r.body.length === 0 ? undefined : r.body);
}

/**
 * Whether a name comes twice (then grouped: setHeader replaces); compared pairwise, as there are few,
 * and lower-cased only when two names have the same length (the only way they can be equal).
 */
function hasRepeatedName(headers: ReadonlyArray<readonly [string, string]>): boolean {
  const n = headers.length;
  if (n > 16) return true; // many: grouped anyway
  for (let i = 1; i < n; i++) {
    const name = headers[i]![0];
    for (let j = 0; j < i; j++) {
      const other = headers[j]![0];
      if (other.length === name.length && (other === name || other.toLowerCase() === name.toLowerCase())) {
        return true;
      }
    }
  }
  return false;
}

/** The framework-free request the lifecycle reads, over a Node request (a class: no closure per request). */
export class NodeIdemRequest implements IdemRequest {
  readonly method: string;
  constructor(
    private readonly req: IncomingMessage,
    readonly path: string,
  ) {
    this.method = req.method ?? "GET";
  }
  header(name: string): string | undefined {
    return headerOf(this.req, name);
  }
}
