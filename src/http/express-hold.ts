/**
 * Holding back what an Express chain writes until the lifecycle has decided (committed or rolled back),
 * then sending the response it chose. Holding writeHead/write/end also catches `res.json`, `res.send`,
 * streams piped into `res` and Express's own error handler, which all end in these three. The held
 * methods are shared functions that find this request's state in a WeakMap (one object per request, no
 * closures), reached through Express's response prototype or set on the instance (see Held).
 */
import { ServerResponse } from "node:http";
import type { StoredResponse } from "../core/index.ts";
import { headerPairs, writeResponse } from "./shared.ts";

type Res = ServerResponse;

/** The held response of each `res` (a WeakMap, not a property: see Held). */
const helds = new WeakMap<Res, Held>();

/** The four methods a held response answers itself. */
type Writer = "writeHead" | "write" | "end" | "flushHeaders";
type Writers = Pick<Res, Writer>;

/**
 * Express sets every res's prototype (`Object.setPrototypeOf(res, app.response)`), after which V8 shares
 * no hidden class between responses: each property added to `res` builds a new one, copying its forty
 * descriptors (four methods added and deleted again cost microseconds per request:
 * docs/decisions/express-answer-hold.md). So a response is held without touching `res` when it can be:
 *
 *   - by the prototype (the usual case): the four methods are defined once on Express's `response`
 *     object, which every app's `app.response` inherits from (mounted apps' too), as methods that answer
 *     from the held state when `res` is held and call ServerResponse's own otherwise (one WeakMap
 *     lookup per call). Taken only when nothing shadows them on `res` or an `app.response`;
 *   - on the instance, when something does (a middleware before this one that wrapped `res.end` on the
 *     instance, as on-headers does): the four are set on `res` itself, the wrappers kept to call on
 *     release. Inherited originals are taken away again with `delete` in the reverse order, which V8
 *     undoes by stepping back to the previous hidden class; own ones are assigned back.
 *
 * In both cases, wrappers a middleware after this one set on `res` while it was held (they called the
 * held methods) are taken away on release, so the answer goes out through what was in place before.
 *
 * One held response: what the chain wrote, and how to hand it on.
 */
export class Held {
  readonly finished: Promise<StoredResponse>;
  chunks: Buffer[] = [];
  onEnd: (() => void) | undefined;
  finish!: (r: StoredResponse) => void;
  /** Held on the instance: the methods in place before (ServerResponse's, or another middleware's wrappers). */
  private readonly replaced: Writers | undefined;
  /** Held on the instance: whether any of those four was an own property of `res` (then all are assigned back). */
  private readonly hadOwn: boolean = false;
  constructor(readonly res: Res) {
    this.finished = new Promise<StoredResponse>((resolve) => {
      this.finish = resolve;
    });
    helds.set(res, this);
    if (heldByPrototype(res)) return;
    this.replaced = {
      writeHead: res.writeHead,
      write: res.write,
      end: res.end,
      flushHeaders: res.flushHeaders,
    };
    this.hadOwn =
      Object.hasOwn(res, "writeHead") ||
      Object.hasOwn(res, "write") ||
      Object.hasOwn(res, "end") ||
      Object.hasOwn(res, "flushHeaders");
    res.writeHead = heldWriteHead as Res["writeHead"];
    res.write = heldWrite as Res["write"];
    res.end = heldEnd as Res["end"];
    res.flushHeaders = noop;
  }

  /** Put the real methods back and forget what the chain set (for Express's error handling). */
  restore(): void {
    this.putBack();
    clearHeaders(this.res);
  }

  /** Send `r` for real. */
  release(r: StoredResponse): void {
    this.putBack();
    const res = this.res;
    // What the chain set is forgotten, but for the names `r` sets again (all of them when `r` is the
    // chain's own answer): writing those replaces them anyway.
    for (const name of res.getHeaderNames()) {
      if (!r.headers.some((h) => h[0] === name)) res.removeHeader(name);
    }
    res.statusCode = 200;
    if (this.onEnd) res.once("finish", this.onEnd);
    writeResponse(res, r);
  }

  /** Put the methods in place before back, and forget the held state. */
  private putBack(): void {
    const res = this.res;
    helds.delete(res);
    const r = res as Partial<Res>;
    if (!this.hadOwn) {
      // Ours (held on the instance) or later wrappers: gone in reverse order, what was inherited is back.
      if (Object.hasOwn(res, "flushHeaders")) delete r.flushHeaders;
      if (Object.hasOwn(res, "end")) delete r.end;
      if (Object.hasOwn(res, "write")) delete r.write;
      if (Object.hasOwn(res, "writeHead")) delete r.writeHead;
    }
    const was = this.replaced;
    if (was) {
      // Assigned when deleting did not bring the same method back (own before, or another prototype now).
      if (res.writeHead !== was.writeHead) res.writeHead = was.writeHead;
      if (res.write !== was.write) res.write = was.write;
      if (res.end !== was.end) res.end = was.end;
      if (res.flushHeaders !== was.flushHeaders) res.flushHeaders = was.flushHeaders;
    }
  }
}

/** Express's `response` objects seen: whether the four writers defined there hold back a held `res`. */
const bases = new WeakMap<object, boolean>();

/**
 * Whether `res` is held by the methods on Express's `response` (defined there on first use): true when
 * `res` inherits from it and nothing between them shadows the four. False for anything else (a
 * ServerResponse that Express did not set up, wrappers on the instance, writers another library
 * defined on Express's `response`).
 */
function heldByPrototype(res: Res): boolean {
  let base = Object.getPrototypeOf(res) as object | null;
  // Up the app.response chain (mounted apps inherit from their parent's) to Express's own `response`:
  // the object just above ServerResponse.prototype, with Express's `send` and `json`.
  while (base !== null && Object.getPrototypeOf(base) !== ServerResponse.prototype) {
    base = Object.getPrototypeOf(base) as object | null;
  }
  if (base === null) return false;
  let usable = bases.get(base);
  if (usable === undefined) {
    usable = Object.hasOwn(base, "send") && Object.hasOwn(base, "json") && hook(base);
    bases.set(base, usable);
  }
  const own = base as Writers;
  return (
    usable &&
    res.end === own.end &&
    res.write === own.write &&
    res.writeHead === own.writeHead &&
    res.flushHeaders === own.flushHeaders
  );
}

/** Define the four on Express's `response` (once): held state when `this` is held, ServerResponse's otherwise. */
function hook(base: object): boolean {
  const names: Writer[] = ["writeHead", "write", "end", "flushHeaders"];
  if (names.some((name) => Object.hasOwn(base, name))) return false; // another library's: left alone
  const holding: Record<Writer, (this: Res, ...args: any[]) => unknown> = {
    writeHead: heldWriteHead,
    write: heldWrite,
    end: heldEnd,
    flushHeaders: noop,
  };
  const proto = ServerResponse.prototype as unknown as Record<Writer, (...args: unknown[]) => unknown>;
  for (const name of names) {
    const original = proto[name];
    const held = holding[name];
    const method = {
      [name](this: Res, ...args: unknown[]) {
        return helds.has(this) ? held.apply(this, args) : original.apply(this, args);
      },
    }[name]!;
    Object.defineProperty(base, name, {
      value: method,
      writable: true,
      configurable: true,
      enumerable: false,
    });
  }
  return true;
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
