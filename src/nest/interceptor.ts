/**
 * The NestJS interceptor behind `@Idempotent()` and `@IdempotentPhases()`: it translates a Nest request
 * (on Express or on Fastify alike) into the one lifecycle (src/core/lifecycle.ts) and the lifecycle's
 * answers into a web `Response`, which Nest sends with its status and headers as they are. Routes
 * without one of the two decorators pass through untouched.
 *
 * In atomic mode the route handler runs inside the key's transaction: it finds it with the
 * `@IdempotencyCtx()` parameter decorator and writes through it (or through its ORM's transaction,
 * e.g. `idemDb.tx(idem.tx)` from `idem/drizzle`); what it returns is saved and replayed byte for byte.
 * An exception it throws (an `HttpException` too) rolls everything back, saves nothing, and goes on to
 * Nest's exception filters.
 */
import { type IncomingMessage, ServerResponse } from "node:http";
import {
  type CallHandler,
  type ExecutionContext,
  Inject,
  type NestInterceptor,
  type OnModuleInit,
  Optional,
  UseInterceptors,
} from "@nestjs/common";
import { from, lastValueFrom, type Observable } from "rxjs";
import type {
  Begun,
  LifecycleOptions,
  PhasesRunnerLike,
  RequestBody,
  RunOptions,
  StoredResponse,
  Tx,
} from "../core/index.ts";
import { checkRouteOptions, Lifecycle, parsedBody } from "../core/index.ts";
import { NULL_BODY_STATUSES, toResponse, toStored } from "../http/fetch.ts";
import {
  bufferOf,
  groupHeaders,
  headerPairs,
  NodeIdemRequest,
  SocketHangUp,
  writeResponse,
} from "../http/shared.ts";

/**
 * What an `@Idempotent()` handler gets through `@IdempotencyCtx()`; `Body` is your DTO's type, as with
 * `@Body() dto: PaymentDto` (Nest's pipes validate `@Body()`; `body` here is the same request as read
 * once and fingerprinted).
 */
export interface NestIdempotencyContext<Body = unknown> {
  /** The transaction of this request (atomic mode): do the work's writes here. */
  tx: Tx;
  /**
   * The request's idempotency key. (On a `required: false` route called without a key, the one case
   * this type does not show, `key` is undefined, and so is `scope` when the caller is anonymous.)
   */
  key: string;
  /** The caller's scope, as the module's `scope` gave it. */
  scope: string;
  /** The body as read once, and fingerprinted. */
  body: Body;
}

/**
 * The module's options: the store and how to find the caller, shared by every idempotent route. `Req`
 * is your platform's request (`Request` from express, or `FastifyRequest`); default: Node's.
 */
export interface IdempotencyModuleOptions<Req = IncomingMessage> extends LifecycleOptions<Tx> {
  /** The caller's scope (their account id), from authentication, never from the body. Required. */
  scope: (request: Req) => string | undefined | Promise<string | undefined>;
  /**
   * Runs before a saved answer is replayed (or, in phases mode, an existing key resumed): false answers
   * 401 and sends nothing of the saved answer. Default: none.
   */
  authorizeReplay?: (request: Req) => boolean | Promise<boolean>;
}

/** Per-route options of `@Idempotent()`: anything of the module's lifecycle options, overridden. */
export type IdempotentRouteOptions<Req = IncomingMessage> = Partial<
  Omit<IdempotencyModuleOptions<Req>, "store" | "scope">
>;

/** A phases route's options: the module's, overridden per route, and the route's answer bound. */
export interface IdempotentPhasesRouteOptions<Req = IncomingMessage>
  extends Partial<Omit<IdempotencyModuleOptions<Req>, "store" | "required" | "compact">> {
  /** The route's answer bound in ms (`Idempotency-Answer-Within`). Default: 5,000. */
  answerWithinMs?: number;
}

/**
 * The options as the interceptor holds them: their callbacks take the platform's request, whatever
 * request type the application wrote them for (Express's, Fastify's or Node's).
 */
type HeldOptions = IdempotencyModuleOptions<any>;

type Route =
  | { mode: "atomic"; options: Partial<HeldOptions> }
  | {
      mode: "phases";
      runner: PhasesRunnerLike<unknown>;
      options: Partial<HeldOptions> & { answerWithinMs?: number };
    };

/** The injection token of the module's options (provided by `IdempotencyModule.forRoot()`). */
export const IDEMPOTENCY_OPTIONS = Symbol("idem:options");

/**
 * Put on every route the decorators mark, so that Nest instantiates it with the controller: without
 * `IdempotencyModule.forRoot()` it fails `app.init()` with the fix, rather than each request later.
 */
class IdempotencyModuleCheck implements NestInterceptor, OnModuleInit {
  constructor(private readonly options?: HeldOptions) {}
  onModuleInit(): void {
    if (!this.options) {
      throw new Error(
        "idem: @Idempotent()/@IdempotentPhases() routes need IdempotencyModule.forRoot({ store, scope }) " +
          "(or forRootAsync) in the application module's imports",
      );
    }
  }
  intercept(_context: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle();
  }
}
// The parameter decorators, applied as functions (idem's sources are run without decorator syntax).
Inject(IDEMPOTENCY_OPTIONS)(IdempotencyModuleCheck, undefined, 0);
Optional()(IdempotencyModuleCheck, undefined, 0);

/** Route handlers marked by the decorators (keyed by the handler function Nest reports). */
const routes = new WeakMap<object, Route>();
const CONTEXT = Symbol("idem:nest-context");

/**
 * Mark a route handler idempotent (atomic mode). `IdempotencyModule.forRoot()` supplies the store and
 * the scope; `options` override the module's per route (e.g. `{ required: false }`).
 */
export function Idempotent<Req = IncomingMessage>(
  options: IdempotentRouteOptions<Req> = {},
): MethodDecorator {
  return (target, key, descriptor) => {
    routes.set(descriptor.value as object, { mode: "atomic", options });
    UseInterceptors(IdempotencyModuleCheck)(target, key, descriptor);
  };
}

/**
 * Mark a route handler as a phases route: the handler validates the request and returns the runner's
 * input (it runs before the key is claimed); the runner does the work and its answer is sent.
 */
export function IdempotentPhases<I, Req = IncomingMessage>(
  runner: PhasesRunnerLike<I>,
  options: IdempotentPhasesRouteOptions<Req> = {},
): MethodDecorator {
  return (target, key, descriptor) => {
    routes.set(descriptor.value as object, { mode: "phases", runner, options });
    UseInterceptors(IdempotencyModuleCheck)(target, key, descriptor);
  };
}

/** The idempotency context of a request inside an `@Idempotent()` handler (what `@IdempotencyCtx()` reads). */
export function idempotencyOf(request: object): NestIdempotencyContext {
  const ctx = (request as { [CONTEXT]?: NestIdempotencyContext })[CONTEXT];
  if (!ctx) throw new Error("idem: no idempotency context here; mark the route handler with @Idempotent()");
  return ctx;
}

const encoder = new TextEncoder();

/** What a handler returned, as Nest would send it: a `Response` as it is, else the body and `res`'s status. */
async function storedOf(value: unknown, res: NestResponse): Promise<StoredResponse> {
  if (value instanceof Response) return toStored(value);
  const headers = headerPairs(res.getHeaders());
  const type = (t: string) => {
    if (!headers.some(([k]) => k === "content-type")) headers.push(["content-type", t]);
  };
  let body: Uint8Array = new Uint8Array(0);
  if (value instanceof Uint8Array) {
    type("application/octet-stream");
    body = value;
  } else if (typeof value === "string") {
    type("text/plain; charset=utf-8");
    body = encoder.encode(value);
  } else if (value !== undefined && value !== null) {
    type("application/json; charset=utf-8");
    body = encoder.encode(JSON.stringify(value));
  }
  return { status: res.statusCode, headers, body };
}

/** The slice of an Express request or a Fastify request this reads. */
interface NestRequest {
  raw?: IncomingMessage;
  originalUrl?: string;
  url: string;
  body?: unknown;
  rawBody?: Buffer;
  [CONTEXT]?: NestIdempotencyContext;
}
/** The slice of an Express response or a Fastify reply this reads. */
interface NestResponse {
  raw?: ServerResponse;
  statusCode: number;
  getHeaders(): Record<string, number | string | readonly string[] | undefined>;
  removeHeader(name: string): unknown;
}

/** The bytes when Nest kept them (`rawBody: true`), else the value its parser made. */
function bodyOf(req: NestRequest): Uint8Array | RequestBody {
  if (req.rawBody instanceof Uint8Array) return req.rawBody;
  if (req.body instanceof Uint8Array) return req.body;
  if (typeof req.body === "string") return encoder.encode(req.body);
  return parsedBody(req.body);
}

/**
 * An answer for the platform adapter to send as it is (status, headers and bytes): what the interceptor
 * hands Nest when `answersDirectly` took over the adapter's `reply`.
 */
class OwedAnswer {
  // Private: should another interceptor wrap this result (`{ data: result }`) and Nest serialize it, the
  // answer's headers (a Set-Cookie among them) stay out of that body, as a Response's do.
  readonly #response: StoredResponse;
  constructor(response: StoredResponse) {
    this.#response = response;
  }
  get response(): StoredResponse {
    return this.#response;
  }
}

/** The slice of Nest's HTTP adapter (`HttpAdapterHost.httpAdapter`) that `answersDirectly` uses. */
interface NestHttpAdapter {
  getType(): string;
  reply(response: unknown, body: unknown, statusCode?: number): unknown;
}

/** The slice of a Fastify reply an answer is sent through. */
interface FastifyReplyLike {
  code(status: number): unknown;
  removeHeader(name: string): unknown;
  header(name: string, value: string | string[]): unknown;
  send(payload?: Buffer): unknown;
}

/** The adapters whose `reply` sends an `OwedAnswer` itself. */
const answering = new WeakSet<object>();

/**
 * Let `adapter` (Nest's Express or Fastify adapter) send an `OwedAnswer` itself; false for any other
 * platform, which then gets web `Response`s. Done once per adapter, at bootstrap.
 *
 * Why: a web `Response` is the only result Nest sends with a status of its own choosing (a route's
 * other results get the route's status, 201 for every POST), and Nest sends it as a stream (the body's
 * ReadableStream read into a Node stream, piped, chunked), at several times the CPU of writing the answer
 * directly (docs/decisions/nestjs-answer-path.md). Every
 * other result still takes Nest's own path; an `OwedAnswer` is written as the node adapter writes
 * (Express), or through the reply's `code`, `header` and `send` (Fastify, whose hooks then run as for
 * any reply).
 */
function answersDirectly(adapter: unknown): boolean {
  const a = adapter as Partial<NestHttpAdapter> | undefined;
  if (typeof a?.reply !== "function" || typeof a.getType !== "function") return false;
  if (answering.has(a)) return true;
  const type = a.getType();
  if (type !== "express" && type !== "fastify") return false;
  const reply = a.reply;
  a.reply = function replyOrAnswer(this: unknown, response: unknown, body: unknown, statusCode?: number) {
    if (!(body instanceof OwedAnswer)) return reply.call(this, response, body, statusCode);
    const r = body.response;
    // Express's response is Node's (so is a raw response on Fastify); else a Fastify reply.
    if (response instanceof ServerResponse) return writeResponse(response, r);
    const fastify = response as FastifyReplyLike;
    fastify.code(r.status);
    for (const [name, values] of groupHeaders(r.headers)) {
      // Replaced, as Node's setHeader does on Express: Fastify's header() appends a Set-Cookie to one the
      // handler set, and that one is in the answer already.
      fastify.removeHeader(name);
      fastify.header(name, values.length === 1 ? values[0]! : values);
    }
    const empty = NULL_BODY_STATUSES.has(r.status) || r.body.length === 0;
    return fastify.send(empty ? undefined : bufferOf(r.body));
  };
  answering.add(a);
  return true;
}

/** The interceptor `IdempotencyModule` installs: it runs the routes marked idempotent through idem. */
export class IdempotencyInterceptor implements NestInterceptor {
  private readonly lifecycles = new WeakMap<object, Lifecycle<Tx>>();
  /** Whether answers go to Nest as `OwedAnswer`s (see `answersDirectly`) rather than web `Response`s. */
  private readonly direct: boolean;
  /**
   * `adapter`: the application's HTTP adapter (`HttpAdapterHost.httpAdapter`, which `IdempotencyModule`
   * passes); without it answers are web `Response`s, which Nest sends as streams.
   */
  constructor(
    private readonly options: IdempotencyModuleOptions<any>,
    adapter?: unknown,
  ) {
    // At bootstrap (the module's factory runs then), never per request.
    checkRouteOptions("IdempotencyModule.forRoot()", options, "atomic");
    this.direct = answersDirectly(adapter);
  }

  /** The lifecycle's answer in the form Nest is handed, for the platform's response `res`. */
  private answer(r: StoredResponse, res: NestResponse): OwedAnswer | Response {
    if (this.direct) return new OwedAnswer(r);
    // Nest adds a Response's headers to the ones already on the platform's response, so a Set-Cookie
    // the handler set there (and that the answer holds) would go out twice: each header of the answer
    // replaces the one there, as on the direct path.
    for (const name of new Set(r.headers.map(([n]) => n.toLowerCase()))) res.removeHeader(name);
    return toResponse(r);
  }

  /** Nest's hook: a marked route's handler runs inside a claim; other routes pass through. */
  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    const route = context.getType() === "http" ? routes.get(context.getHandler()) : undefined;
    if (!route) return next.handle();
    return from(this.handle(route, this.lifecycleOf(context.getHandler(), route), context, next));
  }

  private lifecycleOf(handler: object, route: Route): Lifecycle<Tx> {
    let lifecycle = this.lifecycles.get(handler);
    if (!lifecycle) {
      lifecycle =
        route.mode === "atomic"
          ? new Lifecycle<Tx>({ ...this.options, ...route.options })
          : Lifecycle.forPhases<Tx>(
              { ...this.options, ...route.options },
              route.options.answerWithinMs,
              route.runner.store,
            );
      this.lifecycles.set(handler, lifecycle);
    }
    return lifecycle;
  }

  private async handle(
    route: Route,
    lifecycle: Lifecycle<Tx>,
    context: ExecutionContext,
    next: CallHandler,
  ): Promise<OwedAnswer | Response> {
    const http = context.switchToHttp();
    const req = http.getRequest<NestRequest>();
    const res = http.getResponse<NestResponse>();
    const incoming = req.raw ?? (req as unknown as IncomingMessage);
    const outgoing = res.raw ?? (res as unknown as ServerResponse);
    const check = route.options.authorizeReplay ?? this.options.authorizeReplay;
    const run: RunOptions = {
      signal: new SocketHangUp(incoming.socket, outgoing),
      authorize: check && (() => check(req)),
    };
    const produce = async () =>
      storedOf(await lastValueFrom(next.handle(), { defaultValue: undefined }), res);
    let begun: Begun | undefined;
    try {
      const scope = await this.options.scope(req);
      begun = lifecycle.begin(new NodeIdemRequest(incoming, req.originalUrl ?? req.url), scope, bodyOf(req));
      if (begun.kind === "answer") return this.answer(begun.response, res);
      const body = begun.body.value;
      if (begun.kind === "unkeyed") {
        return this.answer(
          await lifecycle.unkeyed(begun, async (tx) => {
            // Undefined key and scope: the unkeyed request of a `required: false` route (documented).
            req[CONTEXT] = { tx, key: undefined, scope, body } as unknown as NestIdempotencyContext;
            return produce();
          }),
          res,
        );
      }
      const { key, scope: claimed } = begun.claim;
      if (route.mode === "phases") {
        const input = await lastValueFrom(next.handle(), { defaultValue: undefined });
        return this.answer((await lifecycle.phases(begun, route.runner, input, run)).response, res);
      }
      const out = await lifecycle.keyed(
        begun,
        async (tx) => {
          req[CONTEXT] = { tx, key, scope: claimed, body };
          return produce();
        },
        run,
      );
      return this.answer(out.response, res);
    } catch (err) {
      const owed = lifecycle.failure(err, begun); // e.g. 503 when the database is down
      if (owed) return this.answer(owed, res);
      throw err; // the handler's: rolled back, nothing saved; Nest's exception filters answer
    }
  }
}
