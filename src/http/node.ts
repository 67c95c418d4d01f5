/**
 * Plain `node:http` adapter: `idempotency(handler, options)` returns a request listener (atomic mode),
 * `idempotentPhases(options)` one for a route in phases mode.
 *
 *   http.createServer(
 *     idempotency(
 *       async (req, { tx, scope, body }) => {
 *         const payment = await insertPayment(tx, scope, body as PaymentInput);
 *         return { status: 201, headers: { "content-type": "application/json" }, body: JSON.stringify(payment) };
 *       },
 *       { store, scope: (req) => accountOf(req) },
 *     ),
 *   );
 *
 * The listener reads the body itself (up to `limit` bytes, 413 beyond) once: the handler gets it as
 * `ctx.body` (parsed JSON, form fields, or bytes: the value that was fingerprinted) and `ctx.rawBody`.
 * Validate there before doing any write: an answer that is not final (4xx other than the
 * `saveStatuses`, 5xx) rolls the transaction back and saves nothing.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type {
  AdapterOptions,
  AdapterPhasesOptions,
  Begun,
  LifecycleOptions,
  RunOptions,
  StoredResponse,
  Tx,
} from "../core/index.ts";
import { checkRouteOptions, IdemOptionsError, Lifecycle } from "../core/index.ts";
import { NodeIdemRequest, readBody, SocketHangUp, writeResponse } from "./shared.ts";

/**
 * What the handler gets. `Keyed` is false on a `required: false` route, where a request without a key
 * runs with `key` (and possibly `scope`) undefined; `Body` is the body's type when you know it.
 */
export interface NodeIdempotencyContext<Body = unknown, Keyed extends boolean = true> {
  /** The transaction of this request (atomic mode): do the work's writes here. */
  tx: Tx;
  /** The request's idempotency key. */
  key: Keyed extends true ? string : string | undefined;
  /** The caller's scope, as the route's `scope` gave it. */
  scope: Keyed extends true ? string : string | undefined;
  /**
   * The body as read once, and fingerprinted: parsed JSON, form fields (`Record<string, string>`,
   * arrays for `repeatable` fields), the raw bytes, or undefined for none.
   */
  body: Body;
  /** The body's bytes as received. */
  rawBody: Uint8Array;
}

/** What the handler answers. */
export interface NodeReply {
  /** The HTTP status. */
  status: number;
  /** Header names and values; an array value sends the header once per value (Set-Cookie), undefined none. */
  headers?:
    | Record<string, string | number | readonly string[] | undefined>
    | Iterable<readonly [string, string]>;
  /** The body; none when absent. */
  body?: string | Uint8Array;
}

/** The handler `idempotency()` wraps: it gets the request and the context, and returns the reply. */
export type NodeIdempotentHandler<Body = unknown, Keyed extends boolean = true> = (
  req: IncomingMessage,
  ctx: NodeIdempotencyContext<Body, Keyed>,
) => Promise<NodeReply>;

/** The route options the Node handler takes (`AdapterOptions`, documented there). */
type NodeRouteOptions = AdapterOptions<[IncomingMessage]>;

/** The options of `idempotency()`: the store, the scope and the route's rules. */
export interface NodeIdempotencyOptions extends LifecycleOptions<Tx>, AdapterOptions<[IncomingMessage]> {}

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

/**
 * The listener around one request: read it, let `run` answer it, and turn what escapes into idem's
 * answer (413, 503 when the database is down) or a 500 after `onError`.
 */
function listener(
  lifecycle: Lifecycle<Tx>,
  options: NodeRouteOptions,
  run: (
    req: IncomingMessage,
    begun: Begun & { kind: "keyed" | "unkeyed" },
    raw: Uint8Array,
    res: ServerResponse,
  ) => Promise<{ response: StoredResponse }>,
): (req: IncomingMessage, res: ServerResponse) => void {
  const onError = options.onError ?? ((err: unknown) => console.error(err));
  const limit = options.limit;
  // One async function per request: read, begin, run, write; what escapes is answered in its catch.
  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let begun: Begun | undefined;
    try {
      const raw = await readBody(req, limit);
      const scoped = options.scope(req);
      const scope = typeof scoped === "object" ? await scoped : scoped; // a string, undefined or a promise
      begun = lifecycle.begin(new NodeIdemRequest(req, req.url ?? "/"), scope, raw);
      writeResponse(
        res,
        begun.kind === "answer" ? begun.response : (await run(req, begun, raw, res)).response,
      );
    } catch (err) {
      const owed = lifecycle.failure(err, begun); // 413, or the database down
      if (owed) return writeResponse(res, owed);
      onError(err, req); // the handler threw: the transaction rolled back, nothing was saved
      if (!res.headersSent) writeResponse(res, lifecycle.internalError(begun));
      else res.destroy();
    }
  }
  return function idempotentListener(req, res) {
    handle(req, res).catch((err: unknown) => {
      // onError itself threw: nothing more can be said on this request
      console.error(err);
      res.destroy();
    });
  };
}

function authorizer(options: NodeRouteOptions, req: IncomingMessage): RunOptions["authorize"] {
  const check = options.authorizeReplay;
  return check && (() => check(req));
}

/** Wrap a `node:http` handler as a keyed route in atomic mode: returns the request listener. */
export function idempotency<Body = unknown>(
  handler: NodeIdempotentHandler<Body>,
  options: NodeIdempotencyOptions & { required?: true },
): (req: IncomingMessage, res: ServerResponse) => void;
/** The same with `required: false`: a request without a key goes through, so `key` and `scope` may be undefined. */
export function idempotency<Body = unknown>(
  handler: NodeIdempotentHandler<Body, false>,
  options: NodeIdempotencyOptions,
): (req: IncomingMessage, res: ServerResponse) => void;
export function idempotency(
  handler: NodeIdempotentHandler<any, any>, // one of the two above; its key is checked by `required`
  options: NodeIdempotencyOptions,
): (req: IncomingMessage, res: ServerResponse) => void {
  if (typeof handler !== "function") {
    throw new IdemOptionsError("idempotency()", "handler", "must be the request handler function", handler);
  }
  checkRouteOptions("idempotency()", options, "atomic");
  const lifecycle = new Lifecycle<Tx>(options);
  // Promise chains rather than async functions on this path: each async layer costs promises and jobs.
  return listener(lifecycle, options, (req, begun, rawBody, res) => {
    const body = begun.body.value;
    if (begun.kind === "unkeyed") {
      const scope = begun.scope;
      return lifecycle
        .unkeyed(begun, (tx) =>
          Promise.resolve(handler(req, { tx, key: undefined, scope, body, rawBody })).then(toStored),
        )
        .then((response) => ({ response }));
    }
    const { scope, key } = begun.claim;
    // Promise.resolve: a handler written as a plain function (returning its reply) works as before.
    const work = (tx: Tx) => Promise.resolve(handler(req, { tx, key, scope, body, rawBody })).then(toStored);
    return lifecycle.keyed(begun, work, {
      signal: new SocketHangUp(req.socket, res),
      authorize: authorizer(options, req),
    });
  });
}

/**
 * The old name of {@link idempotency}, the entry verb every adapter shares.
 * @deprecated Use `idempotency` (same arguments); this alias is removed in the next release.
 */
export const idempotent: typeof idempotency = idempotency;

/** The options of `idempotentPhases()`: the runner, the input read from the request, the route's rules. */
export interface NodePhasesOptions<I>
  extends AdapterPhasesOptions<I, [IncomingMessage]>,
    AdapterOptions<[IncomingMessage]> {}

/** A `node:http` listener for a route in phases mode; a key is always required. */
export function idempotentPhases<I>(
  options: NodePhasesOptions<I>,
): (req: IncomingMessage, res: ServerResponse) => void {
  checkRouteOptions("idempotentPhases()", options, "phases");
  const lifecycle = Lifecycle.forPhases<Tx>(options, options.answerWithinMs, options.runner.store);
  return listener(lifecycle, options, async (req, begun, _raw, res) => {
    if (begun.kind !== "keyed") throw new Error("unreachable: phases routes require a key");
    const input = await options.input(req, begun.body.value);
    return lifecycle.phases(begun, options.runner, input, {
      signal: new SocketHangUp(req.socket, res),
      authorize: authorizer(options, req),
    });
  });
}
