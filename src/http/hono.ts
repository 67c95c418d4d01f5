/**
 * Hono adapter: `idempotency(options)` is a middleware for keyed routes (atomic mode), and
 * `idempotentPhases(options)` the handler of a route in phases mode.
 *
 *   app.post("/v1/payments", auth, validate, idempotency({ store, scope: (c) => c.var.accountId }), handler)
 *
 * Put validation before it, so that a bad request is answered without claiming the key. The handler
 * finds the transaction in `c.var.idempotency.tx` (its writes commit together with the saved answer)
 * and the body as read once, the value that was fingerprinted, in `c.var.idempotency.body`. Both are
 * typed on the routes that use the middleware only (it is built with `createMiddleware`).
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Context, Env, MiddlewareHandler } from "hono";
import { createMiddleware } from "hono/factory";
import type {
  AdapterOptions,
  AdapterPhasesOptions,
  Begun,
  HangUp,
  IdemRequest,
  LifecycleOptions,
  RunOptions,
  StoredResponse,
  Tx,
} from "../core/index.ts";
import { checkRouteOptions, Lifecycle, Outcome, outcomeOfError } from "../core/index.ts";
import { SignalHangUp, toResponse } from "./fetch.ts";
import { SocketHangUp } from "./shared.ts";

/**
 * What a keyed route's handler gets. `Body` is the body's type when you know it (e.g.
 * `idempotency<Env, Payment>` after a validator; `c.req.valid("json")` gives the validator's value of
 * the same bytes). `Keyed` is false on a `required: false` route, where a request without a key runs
 * with `key` (and possibly `scope`) undefined.
 */
export interface IdempotencyVariables<Body = unknown, Keyed extends boolean = true> {
  /** The transaction of this request (atomic mode): do the work's writes here. */
  tx: Tx;
  /** The request's idempotency key. */
  key: Keyed extends true ? string : string | undefined;
  /** The caller's scope, as the route's `scope` gave it. */
  scope: Keyed extends true ? string : string | undefined;
  /**
   * The body as read once, and fingerprinted: parsed JSON, form fields (`Record<string, string>`,
   * arrays for `repeatable` fields), the raw bytes, or undefined. Act on this value, not on a second
   * reading of the request.
   */
  body: Body;
}

/** The variables idem's middlewares set, typed on the routes that use them. */
export type IdempotencyEnv<Body = unknown, Keyed extends boolean = true> = {
  Variables: { idempotency: IdempotencyVariables<Body, Keyed>; idempotencyOutcome: Outcome };
};

/** How the request ended (for logs and metrics), when one of idem's middlewares handled it. */
export function idempotencyOutcome(c: Context): Outcome | undefined {
  return (c as Context<IdempotencyEnv>).get("idempotencyOutcome");
}

/** The route options the Hono middleware takes (`AdapterOptions`, documented there). */
type RouteOptions<E extends Env> = Pick<AdapterOptions<[Context<E>]>, "scope" | "authorizeReplay">;

/** The options of `idempotency()`: the store, the scope and the route's rules. */
export interface HonoIdempotencyOptions<E extends Env = any>
  extends LifecycleOptions<Tx>,
    Pick<AdapterOptions<[Context<E>]>, "scope" | "authorizeReplay"> {}

const encoder = new TextEncoder();
const decoder = new TextDecoder();
/**
 * @hono/node-server's lightweight Response keeps its status, a string or byte body and its headers (a
 * plain object, an array of pairs or a `Headers`) in an own symbol property described "cache"; reading
 * them there spares building a web Response, a `Headers` and a stream for every request (a tenth of a
 * keyed request's CPU). Elsewhere (other runtimes, a streamed body, another version) the response is
 * read the standard way.
 */
let cacheSymbol: symbol | undefined;
function cacheOf(res: Response): unknown[] | undefined {
  cacheSymbol ??= Object.getOwnPropertySymbols(res).find((s) => s.description === "cache");
  const cached = cacheSymbol ? (res as unknown as Record<symbol, unknown>)[cacheSymbol] : undefined;
  return Array.isArray(cached) && cached.length === 3 ? cached : undefined;
}

async function bodyOf(res: Response, cached: unknown[] | undefined): Promise<Uint8Array> {
  if (cached) {
    const body: unknown = cached[1];
    if (typeof body === "string") return encoder.encode(body);
    if (body instanceof Uint8Array) return body;
    if (body === null) return new Uint8Array(0);
  }
  return new Uint8Array(await res.arrayBuffer());
}

/**
 * The response's headers as lower-case pairs: from the lightweight cache when it holds a plain object
 * that `Headers` would take as it is (one value per name, no surrounding spaces), else from `res.headers`.
 */
function headersOf(res: Response, cached: unknown[] | undefined): Array<[string, string]> {
  const h = cached?.[2];
  if (h && typeof h === "object" && !Array.isArray(h) && !(h instanceof Headers)) {
    const pairs: Array<[string, string]> = [];
    const seen = new Set<string>();
    for (const name in h) {
      const value = (h as Record<string, unknown>)[name];
      const lower = name.toLowerCase();
      if (typeof value !== "string" || seen.has(lower) || value.trim() !== value) return [...res.headers];
      seen.add(lower);
      pairs.push([lower, value]);
    }
    return pairs;
  }
  return [...res.headers];
}

/**
 * What the handler reads again through `c.req` (`json()`, `text()`, `arrayBuffer()`) comes from the
 * bytes read here: Hono would otherwise build a web Response around them for each reading.
 */
function seedBodyCache(c: Context, bytes: Uint8Array): void {
  const cache = c.req.bodyCache as Record<string, Promise<unknown> | undefined>;
  if (cache.text) return;
  if (bytes.length <= EAGER_TEXT_MAX) {
    // A small body is decoded now: cheaper than an accessor property
    // (docs/decisions/hono-body-cache.md), which is kept for a large body a handler may never read as text.
    cache.text = Promise.resolve(decoder.decode(bytes));
  } else {
    let text: Promise<string> | undefined;
    Object.defineProperty(cache, "text", {
      configurable: true,
      enumerable: true,
      get: () => (text ??= Promise.resolve(decoder.decode(bytes))),
      set: (v: Promise<string>) => {
        text = v;
      },
    });
  }
}

/** The largest body `seedBodyCache` decodes before the handler asks for it. */
const EAGER_TEXT_MAX = 16_384;

function setResponse(c: Context, r: StoredResponse): void {
  c.res = undefined; // otherwise Hono merges the previous response's headers into the new one
  c.res = toResponse(r);
}

/** The lifecycle's view of a Hono request (a class: no closures per request). */
class HonoRequest implements IdemRequest {
  readonly method: string;
  readonly path: string;
  constructor(private readonly c: Context) {
    this.method = c.req.method;
    const url = c.req.url;
    this.path = url.slice(url.indexOf("/", url.indexOf("//") + 2)); // path and query, no origin
  }
  header(name: string): string | undefined {
    return this.c.req.header(name);
  }
}

/** What @hono/node-server puts in `c.env` (its `HttpBindings`). */
interface NodeBindings {
  incoming?: IncomingMessage;
  outgoing?: ServerResponse;
}

/** On @hono/node-server, the socket tells; elsewhere the request's signal, read only when asked. */
function hangUpOf(c: Context): HangUp {
  const env = c.env as NodeBindings | undefined;
  return env?.incoming
    ? new SocketHangUp(env.incoming.socket, env.outgoing)
    : new SignalHangUp(() => c.req.raw.signal);
}

async function begin(lifecycle: Lifecycle<Tx>, c: Context, scope: string | undefined): Promise<Begun> {
  const bytes = new Uint8Array(await c.req.arrayBuffer()); // Hono caches it for a handler that reads it again
  seedBodyCache(c, bytes);
  return lifecycle.begin(new HonoRequest(c), scope, bytes);
}

function authorizer<E extends Env>(options: RouteOptions<E>, c: Context): RunOptions["authorize"] {
  const check = options.authorizeReplay;
  return check && (() => check(c as Context<E>));
}

/**
 * The middleware of a keyed route (atomic mode). `E`: the app's env (what `scope` reads); `Body`: the
 * body's type in `c.var.idempotency.body`. With the default `required: true`, `key` and `scope` are
 * strings on the route; with `required: false` they may be undefined.
 */
export function idempotency<E extends Env = any, Body = unknown>(
  options: HonoIdempotencyOptions<E> & { required?: true },
): MiddlewareHandler<IdempotencyEnv<Body>>;
/** The same with `required: false`: a request without a key goes through, so `key` and `scope` may be undefined. */
export function idempotency<E extends Env = any, Body = unknown>(
  options: HonoIdempotencyOptions<E>,
): MiddlewareHandler<IdempotencyEnv<Body, false>>;
export function idempotency<E extends Env = any>(options: HonoIdempotencyOptions<E>): MiddlewareHandler<any> {
  checkRouteOptions("idempotency()", options, "atomic");
  const lifecycle = new Lifecycle<Tx>(options);
  return createMiddleware<IdempotencyEnv<unknown, false>>(async function idempotencyMiddleware(c, next) {
    const scope = await options.scope(c as unknown as Context<E>);
    const begun = await begin(lifecycle, c, scope);
    if (begun.kind === "answer") {
      c.set("idempotencyOutcome", Outcome.Invalid);
      setResponse(c, begun.response);
      return;
    }
    const body = begun.body.value;
    try {
      if (begun.kind === "unkeyed") {
        c.set("idempotencyOutcome", Outcome.Unkeyed);
        await lifecycle.unkeyed(begun, async (tx) => {
          c.set("idempotency", { tx, key: undefined, scope, body });
          await next();
          if (c.error) throw c.error; // the handler threw: roll back; Hono's onError already answered
          return c.res;
        });
        return;
      }
      const key = begun.claim.key;
      const out = await lifecycle.keyed(
        begun,
        async (tx) => {
          c.set("idempotency", { tx, key, scope, body });
          await next();
          if (c.error) throw c.error;
          const res = c.res;
          const cached = cacheOf(res);
          return {
            status: res.status,
            headers: headersOf(res, cached),
            body: await bodyOf(res, cached),
          };
        },
        { signal: hangUpOf(c), authorize: authorizer(options, c) },
      );
      c.set("idempotencyOutcome", out.outcome);
      setResponse(c, out.response);
    } catch (err) {
      const owed = lifecycle.failure(err, begun); // e.g. 503 when the database is down
      if (owed) {
        c.set("idempotencyOutcome", outcomeOfError(err));
        setResponse(c, owed);
      } else if (err !== c.error) throw err;
    }
  });
}

/** The options of `idempotentPhases()`: the runner, the input read from the request, the route's rules. */
export interface HonoPhasesOptions<I, E extends Env = any>
  extends AdapterPhasesOptions<I, [Context<E>]>,
    Pick<AdapterOptions<[Context<E>]>, "scope" | "authorizeReplay"> {}

/**
 * Hono handler for a route in phases mode (recovery points, for work that calls other systems):
 *
 *   app.post("/v1/payments", auth, validate, idempotentPhases({ runner, scope, input: (c) => c.var.payment }))
 *
 * It ends the request: the answer is the runner's (saved and replayed when final), or a problem (422,
 * 409 with Retry-After, 503 retryable, 409 operation-uncertain). A key is always required. The
 * client's disconnect does not stop the phases once they began.
 */
export function idempotentPhases<I, E extends Env = any>(
  options: HonoPhasesOptions<I, E>,
): MiddlewareHandler<IdempotencyEnv> {
  checkRouteOptions("idempotentPhases()", options, "phases");
  const lifecycle = Lifecycle.forPhases<Tx>(options, options.answerWithinMs, options.runner.store);
  return createMiddleware<IdempotencyEnv>(async function idempotentPhasesHandler(c) {
    const scope = await options.scope(c as unknown as Context<E>);
    const begun = await begin(lifecycle, c, scope);
    if (begun.kind !== "keyed") {
      // A key is required here, so "unkeyed" cannot happen; "answer" is a 400/401.
      c.set("idempotencyOutcome", Outcome.Invalid);
      if (begun.kind === "answer") setResponse(c, begun.response);
      return c.res;
    }
    try {
      const input = await options.input(c as unknown as Context<E>, begun.body.value);
      const out = await lifecycle.phases(begun, options.runner, input, {
        signal: hangUpOf(c),
        authorize: authorizer(options, c),
      });
      c.set("idempotencyOutcome", out.outcome);
      setResponse(c, out.response);
    } catch (err) {
      const owed = lifecycle.failure(err, begun);
      if (!owed) throw err;
      c.set("idempotencyOutcome", outcomeOfError(err));
      setResponse(c, owed);
    }
    return c.res;
  });
}
