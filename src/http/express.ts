/**
 * Express 5 adapter: `idempotency(options)` is a middleware for keyed routes.
 *
 *   app.post(
 *     "/v1/payments",
 *     express.json({ verify: keepRawBody }), // optional: fingerprint the bytes as sent
 *     authenticate,
 *     validatePayment, // before idempotency: a bad request is answered without claiming the key
 *     idempotency({ store, scope: (req) => req.accountId }),
 *     async (req, res) => {
 *       const payment = await insertPayment(req.idempotency.tx, req.accountId, req.body);
 *       res.status(201).json(payment);
 *     },
 *   );
 *
 * The handler finds the transaction in `req.idempotency.tx`: its writes commit together with the saved
 * response. Its response is held back (status, headers, body) until the transaction has committed, then
 * sent, so a client never sees an answer that was rolled back.
 *
 * A handler error goes to your error handlers as usual (Express gives a middleware no way to see a later
 * next(err)); their answer is what the engine judges, and a 500 is not final, so it rolls back. With
 * `saveServerErrors: true` that 500 would be saved and the handler's writes committed: answer errors
 * with 503 (`RetryableError`) there, or keep the default.
 *
 * The body that is fingerprinted, in order of preference: `req.rawBody` (stored by `keepRawBody` as the
 * `verify` option of `express.json`/`express.urlencoded`/`express.text`), `req.body` when it is a Buffer
 * (`express.raw`) or a string (`express.text`), the canonical JSON of a parsed `req.body`, or, when no
 * parser touched the request, the stream read here (up to `limit` bytes).
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { NextFunction, Request, RequestHandler, Response } from "express";
import type { Tx } from "../core/db.ts";
import type { EngineOptions, IdemRequest, StoredResponse } from "../core/index.ts";
import { canonicalJson, errorResponse, IdemError, IdempotencyEngine } from "../core/index.ts";
import { hangUpSignal, headerOf, readBody, writeResponse } from "./node.ts";

export interface IdempotencyContext {
  /** The transaction of this request (atomic mode): do the work's writes here. */
  tx: Tx;
  /** The request's idempotency key, or undefined on an optional-key route called without one. */
  key: string | undefined;
  scope: string | undefined;
}

declare global {
  namespace Express {
    interface Request {
      /** Set by idem's `idempotency()` middleware for the handlers after it. */
      idempotency: IdempotencyContext;
    }
  }
}

export interface ExpressIdempotencyOptions extends EngineOptions<Tx> {
  /** The caller's scope (their account id), from authentication, never from the body. Required. */
  scope: (req: Request) => string | undefined | Promise<string | undefined>;
  /** The largest body read when no body parser ran before, in bytes (413 beyond). Default: 1 MiB. */
  limit?: number;
}

/** A `verify` option for Express's body parsers that keeps the bytes as sent, for the fingerprint. */
export function keepRawBody(req: IncomingMessage, _res: ServerResponse, buf: Buffer): void {
  (req as IncomingMessage & { rawBody?: Buffer }).rawBody = buf;
}

const encoder = new TextEncoder();

/** The body bytes to fingerprint and the content type they are in. */
async function requestBody(req: Request, limit: number | undefined) {
  const contentType = headerOf(req, "content-type");
  const raw = (req as { rawBody?: unknown }).rawBody;
  if (raw instanceof Uint8Array) return { body: raw, contentType };
  if (typeof raw === "string") return { body: encoder.encode(raw), contentType };
  const parsed: unknown = req.body;
  if (parsed instanceof Uint8Array) return { body: parsed, contentType };
  if (typeof parsed === "string") return { body: encoder.encode(parsed), contentType };
  if (parsed !== undefined) {
    // Parsed without its bytes: fingerprint the value, labelled as JSON whatever it was parsed from, so
    // that a form's "a+b" and "a b" (equal once decoded) are not confused by re-parsing it as a form.
    return { body: encoder.encode(canonicalJson(parsed)), contentType: "application/json" };
  }
  if (req.readableDidRead) {
    throw new Error(
      "idem: the request body was read before the idempotency middleware but is not in req.body or " +
        "req.rawBody; pass `verify: keepRawBody` to the body parser",
    );
  }
  return { body: await readBody(req, limit), contentType };
}

/**
 * Hold back what the handler writes, until `release` sends the response chosen after the commit.
 * Overriding the instance's writeHead/write/end also catches `res.json`, `res.send`, streams piped into
 * `res` and Express's own error handler, which all end in these three.
 */
function holdResponse(res: Response) {
  const original = {
    writeHead: res.writeHead,
    write: res.write,
    end: res.end,
    flushHeaders: res.flushHeaders,
  };
  const chunks: Buffer[] = [];
  let onEnd: (() => void) | undefined;
  let finish!: (r: StoredResponse) => void;
  const finished = new Promise<StoredResponse>((resolve) => {
    finish = resolve;
  });
  const collect = (chunk: unknown, encoding: unknown) => {
    if (typeof chunk === "string") chunks.push(Buffer.from(chunk, encoding as BufferEncoding | undefined));
    else if (chunk instanceof Uint8Array) chunks.push(Buffer.from(chunk));
  };

  res.writeHead = function writeHead(status: number, ...rest: unknown[]) {
    res.statusCode = status;
    if (typeof rest[0] === "string") res.statusMessage = rest.shift() as string;
    const headers = rest[0];
    if (Array.isArray(headers)) {
      // Node's flat form: [name, value, name, value, ...]
      const grouped = new Map<string, string[]>();
      for (let i = 0; i + 1 < headers.length; i += 2) {
        const name = String(headers[i]).toLowerCase();
        grouped.set(name, [...(grouped.get(name) ?? []), String(headers[i + 1])]);
      }
      for (const [name, values] of grouped) res.setHeader(name, values);
    } else if (headers && typeof headers === "object") {
      for (const [name, value] of Object.entries(headers)) res.setHeader(name, value as string | string[]);
    }
    return res;
  } as typeof res.writeHead;
  res.write = function write(chunk: unknown, encoding?: unknown, cb?: unknown) {
    const callback = typeof encoding === "function" ? encoding : cb;
    collect(chunk, typeof encoding === "string" ? encoding : undefined);
    if (typeof callback === "function") process.nextTick(callback as () => void);
    return true;
  } as typeof res.write;
  res.end = function end(chunk?: unknown, encoding?: unknown, cb?: unknown) {
    const callback = [chunk, encoding, cb].find((a) => typeof a === "function");
    if (typeof chunk !== "function") collect(chunk, typeof encoding === "string" ? encoding : undefined);
    onEnd = callback as (() => void) | undefined;
    const headers: Array<[string, string]> = [];
    for (const [name, value] of Object.entries(res.getHeaders())) {
      for (const one of Array.isArray(value) ? value : [value]) headers.push([name, String(one)]);
    }
    finish({ status: res.statusCode, headers, body: Buffer.concat(chunks) });
    return res;
  } as typeof res.end;
  res.flushHeaders = () => {};

  const restore = () => {
    Object.assign(res, original);
    for (const name of res.getHeaderNames()) res.removeHeader(name);
  };
  return {
    finished,
    /** Put the real methods back and forget what the handler set (for Express's error handling). */
    restore() {
      restore();
      res.statusCode = 200;
    },
    /** Send `r` for real. */
    release(r: StoredResponse) {
      restore();
      if (onEnd) res.once("finish", onEnd);
      writeResponse(res, r);
    },
  };
}

class Unsaved {
  constructor(readonly response: StoredResponse) {}
}

export function idempotency(options: ExpressIdempotencyOptions): RequestHandler {
  const engine = new IdempotencyEngine<Tx>(options);
  return async function idempotencyMiddleware(req: Request, res: Response, next: NextFunction) {
    const scope = await options.scope(req);
    let body: { body: Uint8Array; contentType: string | undefined };
    try {
      body = await requestBody(req, options.limit);
    } catch (err) {
      if (err instanceof IdemError) return writeResponse(res, errorResponse(err)); // 413
      throw err;
    }
    const request: IdemRequest = {
      method: req.method,
      path: req.originalUrl,
      header: (name) => (name.toLowerCase() === "content-type" ? body.contentType : headerOf(req, name)),
      body: body.body,
    };
    const prepared = engine.prepare(request, scope);
    if (prepared.kind === "answer") return writeResponse(res, prepared.response);

    const signal = hangUpSignal(res);
    const held = holdResponse(res);
    const key = prepared.kind === "claim" ? prepared.claim.key : undefined;
    // Runs the rest of the chain in `tx`; resolves with the response the chain wrote, including one
    // written by an error handler after next(err) (a 500 is not final: the transaction rolls back).
    const work = (tx: Tx) => {
      req.idempotency = { tx, key, scope };
      next();
      return held.finished;
    };
    let response: StoredResponse;
    try {
      if (prepared.kind === "claim") {
        response = (await engine.execute(prepared.claim, work, { signal })).response;
      } else {
        response = await options.store
          .transaction(
            async (tx) => {
              const r = await work(tx);
              if (r.status >= 500) throw new Unsaved(r);
              return r;
            },
            { scope },
          )
          .catch((err: unknown) => {
            if (err instanceof Unsaved) return err.response;
            throw err;
          });
      }
    } catch (err) {
      // The store failed (before the chain ran, or at commit after it): nothing held back is sent, and
      // Express's error handling answers instead.
      held.restore();
      throw err;
    }
    held.release(response);
  };
}
