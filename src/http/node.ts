/**
 * Plain `node:http` adapter: `idempotent(handler, options)` returns a request listener.
 *
 *   http.createServer(
 *     idempotent(
 *       async (req, { tx, scope, body }) => {
 *         const payment = await insertPayment(tx, scope, JSON.parse(body.toString()));
 *         return { status: 201, headers: { "content-type": "application/json" }, body: JSON.stringify(payment) };
 *       },
 *       { store, scope: (req) => accountOf(req) },
 *     ),
 *   );
 *
 * The listener reads the body itself (up to `limit` bytes, 413 beyond), so the handler gets it as
 * `ctx.body`. Validate there before doing any write: an answer that is not final (4xx other than the
 * `saveStatuses`, 5xx) rolls the transaction back and saves nothing.
 *
 * The helpers `readBody`, `writeResponse` and `hangUpSignal` are exported for the Express adapter and
 * for users who build their own.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Tx } from "../core/db.ts";
import type { EngineOptions, IdemRequest, StoredResponse } from "../core/index.ts";
import { errorResponse, IdemError, IdempotencyEngine, ProblemCode, problemResponse } from "../core/index.ts";

export interface NodeIdempotencyContext {
  /** The transaction of this request (atomic mode): do the work's writes here. */
  tx: Tx;
  /** The request's idempotency key, or undefined on an optional-key route called without one. */
  key: string | undefined;
  scope: string | undefined;
  /** The request body as it was read (the bytes that were fingerprinted). */
  body: Buffer;
}

/** What the handler answers. */
export interface NodeReply {
  status: number;
  /** Header names and values; an array value sends the header once per value (Set-Cookie), undefined none. */
  headers?:
    | Record<string, string | number | readonly string[] | undefined>
    | Iterable<readonly [string, string]>;
  body?: string | Uint8Array;
}

export type NodeIdempotentHandler = (req: IncomingMessage, ctx: NodeIdempotencyContext) => Promise<NodeReply>;

export interface NodeIdempotencyOptions extends EngineOptions<Tx> {
  /** The caller's scope (their account id), from authentication, never from the body. Required. */
  scope: (req: IncomingMessage) => string | undefined | Promise<string | undefined>;
  /** The largest request body read, in bytes; a larger one is answered 413 problem+json. Default: 1 MiB. */
  limit?: number;
  /**
   * Called with an error the handler threw, after the rollback and before the 500 problem+json answer.
   * Default: `console.error`.
   */
  onError?: (err: unknown, req: IncomingMessage) => void;
}

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
      } else resolve(Buffer.concat(chunks, size));
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
 * An AbortSignal that fires when the client goes away before the response was sent. Passed to
 * `engine.execute`, it makes the store roll back instead of saving an answer nobody received
 * (`res`'s close, not `req`'s: since Node 16 `req` closes as soon as its body has been read).
 */
export function hangUpSignal(res: ServerResponse): AbortSignal {
  const controller = new AbortController();
  res.once("close", () => {
    if (!res.writableFinished) controller.abort(new Error("the client closed the connection"));
  });
  return controller.signal;
}

const NULL_BODY = new Set([101, 204, 205, 304]);

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

/** Send a response as the engine returned it. */
export function writeResponse(res: ServerResponse, r: StoredResponse): void {
  for (const [name, values] of groupHeaders(r.headers)) {
    res.setHeader(name, values.length === 1 ? values[0]! : values);
  }
  res.statusCode = r.status;
  res.end(NULL_BODY.has(r.status) || r.body.length === 0 ? undefined : r.body);
}

/** A header of a Node request as one string (repeated headers joined with ", "). */
export function headerOf(req: IncomingMessage, name: string): string | undefined {
  const v = req.headers[name.toLowerCase()];
  return Array.isArray(v) ? v.join(", ") : v;
}

const encoder = new TextEncoder();

function toStored(reply: NodeReply): StoredResponse {
  const pairs: Array<[string, string]> = [];
  const h = reply.headers;
  if (h && Symbol.iterator in h) {
    for (const [k, v] of h as Iterable<readonly [string, string]>) pairs.push([k.toLowerCase(), v]);
  } else if (h) {
    for (const [k, v] of Object.entries(h)) {
      if (v === undefined) continue;
      for (const one of Array.isArray(v) ? v : [v]) pairs.push([k.toLowerCase(), String(one)]);
    }
  }
  const b = reply.body;
  return {
    status: reply.status,
    headers: pairs,
    body: typeof b === "string" ? encoder.encode(b) : (b ?? new Uint8Array()),
  };
}

const INTERNAL_ERROR = problemResponse(
  500,
  "internal-error",
  "The request failed and nothing was saved; a retry with the same Idempotency-Key runs it again.",
);

export function idempotent(
  handler: NodeIdempotentHandler,
  options: NodeIdempotencyOptions,
): (req: IncomingMessage, res: ServerResponse) => void {
  const engine = new IdempotencyEngine<Tx>(options);
  const onError = options.onError ?? ((err: unknown) => console.error(err));

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = await readBody(req, options.limit);
    const scope = await options.scope(req);
    const request: IdemRequest = {
      method: req.method ?? "GET",
      path: req.url ?? "/",
      header: (name) => headerOf(req, name),
      body,
    };
    const prepared = engine.prepare(request, scope);
    if (prepared.kind === "answer") return writeResponse(res, prepared.response);
    if (prepared.kind === "unkeyed") {
      const reply = await options.store.transaction(
        async (tx) => toStored(await handler(req, { tx, key: undefined, scope, body })),
        { scope },
      );
      return writeResponse(res, reply);
    }
    const { claim } = prepared;
    const out = await engine.execute(
      claim,
      async (tx) => toStored(await handler(req, { tx, key: claim.key, scope, body })),
      { signal: hangUpSignal(res) },
    );
    writeResponse(res, out.response);
  }

  return function idempotentListener(req, res) {
    handle(req, res).catch((err: unknown) => {
      if (err instanceof IdemError) return writeResponse(res, errorResponse(err)); // 413, or a store's answer
      onError(err, req); // the handler threw: the transaction rolled back, nothing was saved
      if (!res.headersSent) writeResponse(res, INTERNAL_ERROR);
      else res.destroy();
    });
  };
}
