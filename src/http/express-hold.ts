/**
 * Holding back what an Express chain writes until the lifecycle has decided (committed or rolled back),
 * then sending the response it chose. Overriding the instance's writeHead/write/end also catches
 * `res.json`, `res.send`, streams piped into `res` and Express's own error handler, which all end in
 * these three. The overrides are shared functions that find this request's state in a WeakMap (one
 * object per request, no closures).
 */
import type { ServerResponse } from "node:http";
import type { StoredResponse } from "../core/index.ts";
import { headerPairs, writeResponse } from "./shared.ts";

type Res = ServerResponse;

/** The held response of each `res` (a WeakMap, not a property: see Held). */
const helds = new WeakMap<Res, Held>();

/**
 * After Express's `Object.setPrototypeOf(res, app.response)`, V8 shares no hidden class between
 * responses: each property added to `res` builds a new one (microseconds each, and more garbage). So the
 * state is found in a WeakMap rather than on `res`, and the overrides, added in a fixed order, are taken
 * away again with `delete` in the reverse order when the originals were inherited (the usual case): V8
 * undoes that by stepping back to the previous hidden class. Originals that were own properties (another
 * middleware's wrappers, such as on-headers') are assigned back as before.
 *
 * One held response: what the chain wrote, and how to hand it on.
 */
export class Held {
  readonly finished: Promise<StoredResponse>;
  chunks: Buffer[] = [];
  onEnd: (() => void) | undefined;
  finish!: (r: StoredResponse) => void;
  // The methods in place before (ServerResponse's, or another middleware's wrappers such as on-headers').
  private readonly writeHead: Res["writeHead"];
  private readonly write: Res["write"];
  private readonly end: Res["end"];
  private readonly flushHeaders: Res["flushHeaders"];
  /** Whether any of those four was an own property of `res` (then all four are assigned back). */
  private readonly hadOwn: boolean;
  constructor(readonly res: Res) {
    this.writeHead = res.writeHead;
    this.write = res.write;
    this.end = res.end;
    this.flushHeaders = res.flushHeaders;
    this.hadOwn =
      Object.hasOwn(res, "writeHead") ||
      Object.hasOwn(res, "write") ||
      Object.hasOwn(res, "end") ||
      Object.hasOwn(res, "flushHeaders");
    this.finished = new Promise<StoredResponse>((resolve) => {
      this.finish = resolve;
    });
    helds.set(res, this);
    res.writeHead = heldWriteHead as Res["writeHead"];
    res.write = heldWrite as Res["write"];
    res.end = heldEnd as Res["end"];
    res.flushHeaders = noop;
  }

  /** Put the real methods back and forget what the chain set (for Express's error handling). */
  restore(): void {
    const res = this.res;
    if (!this.hadOwn) {
      const r = res as Partial<Res>;
      delete r.flushHeaders;
      delete r.end;
      delete r.write;
      delete r.writeHead;
    }
    // Assigned when deleting did not bring the same method back (own before, or another prototype now).
    if (res.writeHead !== this.writeHead) res.writeHead = this.writeHead;
    if (res.write !== this.write) res.write = this.write;
    if (res.end !== this.end) res.end = this.end;
    if (res.flushHeaders !== this.flushHeaders) res.flushHeaders = this.flushHeaders;
    helds.delete(res);
    clearHeaders(res);
  }

  /** Send `r` for real. */
  release(r: StoredResponse): void {
    this.restore();
    if (this.onEnd) this.res.once("finish", this.onEnd);
    writeResponse(this.res, r);
  }
}

/** Forget the status and every header set on `res` so far. */
export function clearHeaders(res: Res): void {
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  res.statusCode = 200;
}

function noop(): void {}

function collect(held: Held, chunk: unknown, encoding: unknown): void {
  if (typeof chunk === "string") held.chunks.push(Buffer.from(chunk, encoding as BufferEncoding | undefined));
  else if (chunk instanceof Uint8Array)
    held.chunks.push(Buffer.from(chunk.buffer, chunk.byteOffset, chunk.length));
}

function heldWriteHead(this: Res, status: number, ...rest: unknown[]): Res {
  this.statusCode = status;
  if (typeof rest[0] === "string") this.statusMessage = rest.shift() as string;
  const headers = rest[0];
  if (Array.isArray(headers)) {
    // Node's flat form: [name, value, name, value, ...]
    const grouped = new Map<string, string[]>();
    for (let i = 0; i + 1 < headers.length; i += 2) {
      const name = String(headers[i]).toLowerCase();
      grouped.set(name, [...(grouped.get(name) ?? []), String(headers[i + 1])]);
    }
    for (const [name, values] of grouped) this.setHeader(name, values);
  } else if (headers && typeof headers === "object") {
    for (const [name, value] of Object.entries(headers)) this.setHeader(name, value as string | string[]);
  }
  return this;
}

function heldWrite(this: Res, chunk: unknown, encoding?: unknown, cb?: unknown): boolean {
  const callback = typeof encoding === "function" ? encoding : cb;
  collect(helds.get(this)!, chunk, typeof encoding === "string" ? encoding : undefined);
  if (typeof callback === "function") process.nextTick(callback as () => void);
  return true;
}

function heldEnd(this: Res, chunk?: unknown, encoding?: unknown, cb?: unknown): Res {
  const held = helds.get(this)!;
  if (typeof chunk !== "function") collect(held, chunk, typeof encoding === "string" ? encoding : undefined);
  held.onEnd = (typeof chunk === "function" ? chunk : typeof encoding === "function" ? encoding : cb) as
    | (() => void)
    | undefined;
  const chunks = held.chunks;
  const body = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
  held.finish({ status: this.statusCode, headers: headerPairs(this.getHeaders()), body });
  return this;
}
