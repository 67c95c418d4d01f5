/**
 * Express 5 adapter: `idempotency(options)` is a middleware for keyed routes (atomic mode), and
 * `idempotentPhases(options)` the handler of a route in phases mode.
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
 * The handler finds the transaction in `req.idempotency.tx` (its writes commit together with the saved
 * response) and the body as read once, the value that was fingerprinted, in `req.idempotency.body`. Its response is held back (status, headers, body) until the transaction has committed, then
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
 * parser touched the request, the stream read here (up to `limit` bytes). Duplicate JSON keys and
 * repeated form fields are answered 400 only when idem sees the bytes (`keepRawBody`, or no parser).
 */
import { IncomingMessage, type ServerResponse } from "node:http";
import type { NextFunction, Request, RequestHandler, Response } from "express";
import type {
  AdapterOptions,
  AdapterPhasesOptions,
  Begun,
  IdemRequest,
  LifecycleOptions,
  RequestBody,
  RunOptions,
  StoredResponse,
  Tx,
} from "../core/index.ts";
import { checkRouteOptions, Lifecycle, parsedBody } from "../core/index.ts";
import { clearHeaders, Held } from "./express-hold.ts";
import { headerOf, readBody, SocketHangUp, writeResponse } from "./shared.ts";

/** What `req.idempotency` holds on an idempotent route: the transaction, key, scope and body. */
export interface IdempotencyContext<Body = unknown> {
  /** The transaction of this request (atomic mode): do the work's writes here. */
  tx: Tx;
  /**
   * The request's idempotency key. (On a `required: false` route called without a key, the one case
   * this type does not show, `key` is undefined, and so is `scope` when the caller is anonymous.)
   */
  key: string;
  /** The caller's scope, as the route's `scope` gave it. */
  scope: string;
  /**
   * The body as read once, and fingerprinted: parsed JSON, form fields (`Record<string, string>`,
   * arrays for `repeatable` fields), the raw bytes, or undefined. Act on this value. Typed as the
   * route's request body (`app.post<Params, ResBody, ReqBody>(...)`, like `req.body`).
   */
  body: Body;
}

declare module "express-serve-static-core" {
  interface Request<P, ResBody, ReqBody, ReqQuery, LocalsObj extends Record<string, any>> {
    /** Set by idem's `idempotency()` middleware for the handlers after it. */
    idempotency: IdempotencyContext<ReqBody>;
  }
}

/** The route options the Express middleware takes (`AdapterOptions`, documented there). */
type ExpressRouteOptions = Pick<AdapterOptions<[Request]>, "scope" | "limit" | "authorizeReplay">;

/** The options of `idempotency()`: the store, the scope and the route's rules. */
export interface ExpressIdempotencyOptions
  extends LifecycleOptions<Tx>,
    Pick<AdapterOptions<[Request]>, "scope" | "limit" | "authorizeReplay"> {}

/** A `verify` option for Express's body parsers that keeps the bytes as sent, for the fingerprint. */
export function keepRawBody(req: IncomingMessage, _res: ServerResponse, buf: Buffer): void {
  rawBodies.set(req, buf); // read back as req.rawBody
}

const encoder = new TextEncoder();

/** The body to read: its bytes, or the value a parser left without them. */
async function requestBody(req: Request, limit: number | undefined): Promise<Uint8Array | RequestBody> {
  const raw = (req as { rawBody?: unknown }).rawBody;
  if (raw instanceof Uint8Array) return raw;
  if (typeof raw === "string") return encoder.encode(raw);
  const parsed: unknown = req.body;
  if (parsed instanceof Uint8Array) return parsed;
  if (typeof parsed === "string") return encoder.encode(parsed);
  // Parsed without its bytes: the value itself is what the handler gets and what is fingerprinted.
  if (parsed !== undefined) return parsedBody(parsed);
  if (req.readableDidRead) {
    throw new Error(
      "idem: the request body was read before the idempotency middleware but is not in req.body or " +
        "req.rawBody; pass `verify: keepRawBody` to the body parser",
    );
  }
  return readBody(req, limit);
}

/** The lifecycle's view of an Express request (a class: no closures per request). */
class ExpressRequest implements IdemRequest {
  readonly method: string;
  readonly path: string;
  constructor(private readonly req: Request) {
    this.method = req.method;
    this.path = req.originalUrl;
  }
  header(name: string): string | undefined {
    return headerOf(this.req, name);
  }
}

/** Read the request once; answers 413 or 400/401 itself and returns undefined then. */
async function begin(
  lifecycle: Lifecycle<Tx>,
  options: ExpressRouteOptions,
  req: Request,
  res: Response,
): Promise<Exclude<Begun, { kind: "answer" }> | undefined> {
  const scope = await options.scope(req);
  let begun: Begun;
  try {
    begun = lifecycle.begin(new ExpressRequest(req), scope, await requestBody(req, options.limit));
  } catch (err) {
    const owed = lifecycle.failure(err); // 413
    if (!owed) throw err;
    writeResponse(res, owed);
    return undefined;
  }
  if (begun.kind !== "answer") return begun;
  writeResponse(res, begun.response);
  return undefined;
}

function authorizer(options: ExpressRouteOptions, req: Request): RunOptions["authorize"] {
  const check = options.authorizeReplay;
  return check && (() => check(req));
}

/** Send the lifecycle's answer: through the held response when the chain ran, else straight out. */
function answer(res: Response, held: Held | undefined, r: StoredResponse): void {
  if (held) held.release(r);
  else {
    clearHeaders(res); // what earlier middleware set: a replay sends the saved headers only
    writeResponse(res, r);
  }
}

/**
 * A property of Express requests (`req.idempotency`, `req.rawBody`) kept off the instance: an accessor
 * on Express's `request` object, which every app.request inherits from (mounted apps' too), backed by
 * a WeakMap. Express sets each req's prototype, after which every property added to `req` builds a
 * hidden class of its own (see express-hold.ts): assigned on the instance, each cost microseconds per
 * request. A req that does not inherit from Express's request, or whose app defines the property
 * itself, gets an own property as before; a second copy of idem in the process finds the first one's
 * accessor and assigns through it.
 */
class RequestSlot<T> {
  private readonly values = new WeakMap<object, T>();
  /** The app.request objects seen, and whether Express's request above them has this accessor. */
  private readonly ready = new WeakMap<object, boolean>();
  private readonly get: (this: object) => T | undefined;
  private readonly setter: (this: object, value: T) => void;
  constructor(private readonly name: string) {
    const values = this.values;
    this.get = function get(this: object) {
      return values.get(this);
    };
    this.setter = function set(this: object, value: T) {
      values.set(this, value);
    };
  }

  set(req: IncomingMessage, value: T): void {
    const proto = Object.getPrototypeOf(req) as object | null;
    let ready = proto === null ? false : this.ready.get(proto);
    if (ready === undefined) {
      ready = this.define(proto!);
      this.ready.set(proto!, ready);
    }
    if (ready && !Object.hasOwn(req, this.name)) this.values.set(req, value);
    else (req as unknown as Record<string, unknown>)[this.name] = value;
  }

  /** Define the accessor on Express's `request` above `proto` (once); false when there is none to use. */
  private define(proto: object): boolean {
    let base: object | null = proto;
    while (base !== null && Object.getPrototypeOf(base) !== IncomingMessage.prototype) {
      if (Object.hasOwn(base, this.name)) return false; // an app's own: left alone
      base = Object.getPrototypeOf(base) as object | null;
    }
    // Express's request: the object just above IncomingMessage.prototype, with Express's `get`.
    if (
      base === null ||
      typeof (base as { get?: unknown }).get !== "function" ||
      !Object.hasOwn(base, "get")
    ) {
      return false;
    }
    const found = Object.getOwnPropertyDescriptor(base, this.name);
    if (found) return found.get === this.get;
    Object.defineProperty(base, this.name, {
      get: this.get,
      set: this.setter,
      configurable: true,
      enumerable: false,
    });
    return true;
  }
}

const contexts = new RequestSlot<IdempotencyContext>("idempotency");
const rawBodies = new RequestSlot<Buffer>("rawBody");

/** Express 5 middleware: a keyed route in atomic mode; the handler finds `req.idempotency` (`tx`, `body`). */
export function idempotency(options: ExpressIdempotencyOptions): RequestHandler {
  checkRouteOptions("idempotency()", options, "atomic");
  const lifecycle = new Lifecycle<Tx>(options);
  return async function idempotencyMiddleware(req: Request, res: Response, next: NextFunction) {
    const begun = await begin(lifecycle, options, req, res);
    if (!begun) return;
    // Only a request whose chain runs has its response held back: a replay is written straight out.
    let held: Held | undefined;
    const key = begun.kind === "keyed" ? begun.claim.key : undefined;
    const scope = begun.kind === "keyed" ? begun.claim.scope : begun.scope;
    const body = begun.body.value;
    // Runs the rest of the chain in `tx`; resolves with the response the chain wrote, including one
    // written by an error handler after next(err) (a 500 is not final: the transaction rolls back).
    const work = (tx: Tx) => {
      // key and scope are undefined only on an unkeyed request of a `required: false` route, the case
      // IdempotencyContext documents: keyed routes, the default, type them as the strings they are.
      contexts.set(req, { tx, key, scope, body } as IdempotencyContext);
      held = new Held(res);
      next();
      return held.finished;
    };
    let response: StoredResponse;
    try {
      response =
        begun.kind === "keyed"
          ? (
              await lifecycle.keyed(begun, work, {
                signal: new SocketHangUp(req.socket, res),
                authorize: authorizer(options, req),
              })
            ).response
          : await lifecycle.unkeyed(begun, work);
    } catch (err) {
      const owed = lifecycle.failure(err, begun); // the database went away before or after the chain
      if (owed) return answer(res, held, owed);
      // The store failed otherwise: nothing held back is sent, and Express's error handling answers.
      if (held) held.restore();
      else clearHeaders(res);
      throw err;
    }
    answer(res, held, response);
  };
}

/** The options of `idempotentPhases()`: the runner, the input read from the request, the route's rules. */
export interface ExpressPhasesOptions<I>
  extends AdapterPhasesOptions<I, [Request]>,
    Pick<AdapterOptions<[Request]>, "scope" | "limit" | "authorizeReplay"> {}

/**
 * Express handler for a route in phases mode; it ends the request (a key is always required):
 *
 *   app.post("/v1/payments", express.json({ verify: keepRawBody }), auth, validate,
 *     idempotentPhases({ runner, scope: (req) => req.accountId, input: (req) => res.locals.payment }))
 */
export function idempotentPhases<I>(options: ExpressPhasesOptions<I>): RequestHandler {
  checkRouteOptions("idempotentPhases()", options, "phases");
  const lifecycle = Lifecycle.forPhases<Tx>(options, options.answerWithinMs, options.runner.store);
  return async function idempotentPhasesHandler(req: Request, res: Response) {
    const begun = await begin(lifecycle, options, req, res);
    if (begun?.kind !== "keyed") return;
    let response: StoredResponse;
    try {
      const input = await options.input(req, begun.body.value);
      response = (
        await lifecycle.phases(begun, options.runner, input, {
          signal: new SocketHangUp(req.socket, res),
          authorize: authorizer(options, req),
        })
      ).response;
    } catch (err) {
      const owed = lifecycle.failure(err, begun);
      if (!owed) throw err;
      response = owed;
    }
    writeResponse(res, response);
  };
}
