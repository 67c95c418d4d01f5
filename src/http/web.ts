/**
 * Web-standard adapter: wraps a `(request: Request, ctx) => Promise<Response>` handler, the shape of
 * Next.js route handlers, Bun.serve, Deno.serve, Cloudflare-style `fetch` and anything else built on the
 * Fetch API. `idempotency(handler, options)` is a keyed route in atomic mode, `idempotentPhases(options)`
 * one in phases mode; both return a function of the same shape.
 *
 *   // app/api/payments/route.ts (Next.js)
 *   export const POST = idempotency(
 *     async (request, { tx, scope, body }) => {
 *       const payment = await insertPayment(tx, scope, body as PaymentInput);
 *       return Response.json(payment, { status: 201 });
 *     },
 *     { store, scope: (request) => accountOf(request) },
 *   );
 *
 * The wrapper reads the body once (up to `limit` bytes, 413 beyond) and hands the handler a request
 * whose body can be read again, plus the value it fingerprinted as `ctx.body`. The reply is read whole
 * before it is saved: a streamed body is buffered. Only Fetch API globals are used here (no `node:`
 * module at run time), so the same code runs on Node, Bun, Deno and edge runtimes.
 */
import type {
  AdapterOptions,
  AdapterPhasesOptions,
  Begun,
  IdemRequest,
  LifecycleOptions,
  RunOptions,
  StoredResponse,
  Tx,
} from "../core/index.ts";
import { checkRouteOptions, IdemError, IdemOptionsError, Lifecycle, ProblemCode } from "../core/index.ts";
import { SignalHangUp, toResponse, toStored } from "./fetch.ts";
import { DEFAULT_BODY_LIMIT } from "./shared.ts";

/** What the wrapped handler gets besides the request. */
/**
 * What the handler gets. `Keyed` is false on a `required: false` route, where a request without a key
 * runs with `key` (and possibly `scope`) undefined; `Body` is the body's type when you know it.
 */
export interface WebIdempotencyContext<C = unknown, Body = unknown, Keyed extends boolean = true> {
  /** The transaction of this request (atomic mode): do the work's writes here. */
  tx: Tx;
  /** The request's idempotency key. */
  key: Keyed extends true ? string : string | undefined;
  /** The caller's scope, as the route's `scope` gave it. */
  scope: Keyed extends true ? string : string | undefined;
  /** The body as read once, and fingerprinted: parsed JSON, form fields, the raw bytes, or undefined. */
  body: Body;
  /** The body's bytes as received. */
  rawBody: Uint8Array;
  /** The platform's second argument (Next.js `{ params }`, Bun's server, Deno's info), as passed. */
  context: C;
}

/** The handler `idempotency()` wraps: it gets the request and the context, and returns a `Response`. */
export type WebIdempotentHandler<C = unknown, Body = unknown, Keyed extends boolean = true> = (
  request: Request,
  ctx: WebIdempotencyContext<C, Body, Keyed>,
) => Promise<Response>;

/** The wrapped route: the same shape as the handler's platform expects. */
export type WebHandler<C = unknown> = (request: Request, context: C) => Promise<Response>;

/** The route options the web handler takes (`AdapterOptions`, documented there). */
type WebRouteOptions<C> = AdapterOptions<[Request, C]>;

/** The options of `idempotency()`: the store, the scope and the route's rules. */
export interface WebIdempotencyOptions<C = unknown>
  extends LifecycleOptions<Tx>,
    AdapterOptions<[Request, C]> {}

/** The options of `idempotentPhases()`: the runner, the input read from the request, the route's rules. */
export interface WebPhasesOptions<I, C = unknown>
  extends AdapterPhasesOptions<I, [Request, C]>,
    AdapterOptions<[Request, C]> {}

/** The lifecycle's view of a Fetch API request. */
class WebIdemRequest implements IdemRequest {
  readonly method: string;
  readonly path: string;
  constructor(private readonly request: Request) {
    this.method = request.method;
    const url = new URL(request.url);
    this.path = url.pathname + url.search;
  }
  header(name: string): string | null {
    return this.request.headers.get(name);
  }
}

/** Read the whole body, rejecting with a 413 `IdemError` past `limit` bytes (declared or streamed). */
async function readBody(request: Request, limit: number): Promise<Uint8Array> {
  const tooLarge = () =>
    new IdemError(ProblemCode.BodyTooLarge, 413, `The request body is larger than ${limit} bytes.`);
  if (Number(request.headers.get("content-length")) > limit) throw tooLarge();
  if (!request.body) return new Uint8Array(0);
  const reader = request.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      await reader.cancel().catch(() => {});
      throw tooLarge();
    }
    chunks.push(value);
  }
  if (chunks.length === 1) return chunks[0]!;
  const all = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.byteLength;
  }
  return all;
}

/**
 * The request again, with the body already read, so the handler may read it as usual. Built from its
 * parts, not as `new Request(request)`: a request made by another copy of the Fetch API (Next.js route
 * handlers get one) has internal state this runtime's `Request` cannot read.
 */
function replayable(request: Request, raw: Uint8Array): Request {
  if (request.method === "GET" || request.method === "HEAD") return request;
  return new Request(request.url, {
    method: request.method,
    headers: request.headers,
    body: raw as Uint8Array<ArrayBuffer>,
    signal: request.signal,
  });
}

type Run<C> = (
  request: Request,
  context: C,
  begun: Begun & { kind: "keyed" | "unkeyed" },
  raw: Uint8Array,
) => Promise<StoredResponse>;

/** Read the request, let `run` answer it, and turn what escapes into idem's answer or a 500. */
function route<C>(lifecycle: Lifecycle<Tx>, options: WebRouteOptions<C>, run: Run<C>): WebHandler<C> {
  const onError = options.onError ?? ((err: unknown) => console.error(err));
  const limit = options.limit ?? DEFAULT_BODY_LIMIT;
  return async function idempotentRoute(request, context) {
    let begun: Begun | undefined;
    try {
      const raw = await readBody(request, limit);
      const scope = await options.scope(request, context);
      begun = lifecycle.begin(new WebIdemRequest(request), scope, raw);
      if (begun.kind === "answer") return toResponse(begun.response);
      return toResponse(await run(request, context, begun, raw));
    } catch (err) {
      const owed = lifecycle.failure(err, begun); // 413, or the database down
      if (owed) return toResponse(owed);
      onError(err, request); // the handler threw: the transaction rolled back, nothing was saved
      return toResponse(lifecycle.internalError(begun));
    }
  };
}

function runOptions<C>(options: WebRouteOptions<C>, request: Request, context: C): RunOptions {
  const check = options.authorizeReplay;
  return {
    signal: new SignalHangUp(() => request.signal),
    authorize: check && (() => check(request, context)),
  };
}

/** Wrap a Fetch API handler as a keyed route in atomic mode. */
export function idempotency<C = unknown, Body = unknown>(
  handler: WebIdempotentHandler<C, Body>,
  options: WebIdempotencyOptions<C> & { required?: true },
): WebHandler<C>;
/** The same with `required: false`: a request without a key goes through, so `key` and `scope` may be undefined. */
export function idempotency<C = unknown, Body = unknown>(
  handler: WebIdempotentHandler<C, Body, false>,
  options: WebIdempotencyOptions<C>,
): WebHandler<C>;
export function idempotency<C = unknown>(
  handler: WebIdempotentHandler<C, any, any>, // one of the two above; its key is checked by `required`
  options: WebIdempotencyOptions<C>,
): WebHandler<C> {
  if (typeof handler !== "function") {
    throw new IdemOptionsError("idempotency()", "handler", "must be the request handler function", handler);
  }
  checkRouteOptions("idempotency()", options, "atomic");
  const lifecycle = new Lifecycle<Tx>(options);
  return route(lifecycle, options, async (request, context, begun, rawBody) => {
    const body = begun.body.value;
    const again = () => replayable(request, rawBody);
    if (begun.kind === "unkeyed") {
      const scope = begun.scope;
      return lifecycle.unkeyed(begun, async (tx) =>
        toStored(await handler(again(), { tx, key: undefined, scope, body, rawBody, context })),
      );
    }
    const { scope, key } = begun.claim;
    const out = await lifecycle.keyed(
      begun,
      async (tx) => toStored(await handler(again(), { tx, key, scope, body, rawBody, context })),
      runOptions(options, request, context),
    );
    return out.response;
  });
}

/**
 * The old name of {@link idempotency}, the entry verb every adapter shares.
 * @deprecated Use `idempotency` (same arguments); this alias is removed in the next release.
 */
export const idempotent: typeof idempotency = idempotency;

/** A Fetch API handler for a route in phases mode; a key is always required. */
export function idempotentPhases<I, C = unknown>(options: WebPhasesOptions<I, C>): WebHandler<C> {
  checkRouteOptions("idempotentPhases()", options, "phases");
  const lifecycle = Lifecycle.forPhases<Tx>(options, options.answerWithinMs, options.runner.store);
  return route(lifecycle, options, async (request, context, begun) => {
    if (begun.kind !== "keyed") throw new Error("unreachable: phases routes require a key");
    const input = await options.input(request, begun.body.value, context);
    const out = await lifecycle.phases(begun, options.runner, input, runOptions(options, request, context));
    return out.response;
  });
}

// The operation lookup (GET /v1/operations/{ref}): a Request -> Response handler any adapter mounts.
export {
  DEFAULT_MAX_WAIT_SECONDS,
  type OperationLookupOptions,
  operationLookup,
} from "./operations.ts";
