/**
 * Fastify 5 adapter: `idempotency(options)` returns route hooks (atomic mode), `idempotencyPlugin` the
 * same hooks for every route of a prefix, and `idempotentPhases(options)` a route in phases mode.
 *
 *   const idem = idempotency({ store, scope: (request) => request.accountId });
 *   app.post("/v1/payments", { schema, ...idem }, async (request, reply) => {
 *     const payment = await insertPayment(request.idempotency.tx, request.accountId, request.body);
 *     return reply.code(201).send(payment);
 *   });
 *
 * With hooks of your own, list them together: `preHandler: [authenticate, idem.preHandler]`. For every
 * route of a prefix, register the plugin instead: `app.register(idempotencyPlugin, options)` inside the
 * prefix's own plugin. Schema validation runs before `preHandler`, so a bad request is answered without
 * claiming the key.
 *
 * How it maps onto the lifecycle: `preParsing` keeps a copy of the raw body bytes (for the fingerprint)
 * while Fastify's own parsers read them; `preHandler` claims the key and opens the transaction
 * (`request.idempotency.tx`, and the body as read once in `request.idempotency.body`), then lets the
 * handler run; `onSend` hands the serialized reply to the
 * engine, waits for the commit and sends what the engine chose. A handler error (`onError`) rolls back.
 */
import type {
  FastifyReply,
  FastifyRequest,
  onErrorHookHandler,
  onResponseHookHandler,
  onSendAsyncHookHandler,
  preHandlerAsyncHookHandler,
  preParsingHookHandler,
  RouteHandlerMethod,
} from "fastify";
import fp from "fastify-plugin";
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
import { bufferOf, groupHeaders, headerPairs, SocketHangUp } from "./shared.ts";

/** What `request.idempotency` holds on an idempotent route: the transaction, key, scope and body. */
export interface FastifyIdempotency {
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
   * arrays for `repeatable` fields), the raw bytes, or undefined. `request.body` holds the same
   * request as Fastify parsed it, typed by the route's `Body` generic or its schema's type provider.
   */
  body: unknown;
}

declare module "fastify" {
  interface FastifyRequest {
    /** Set by idem's idempotency hooks for the handler. */
    idempotency: FastifyIdempotency;
  }
}

/** The route options the Fastify hooks take (`AdapterOptions`, documented there). */
type FastifyRouteOptions = Pick<AdapterOptions<[FastifyRequest]>, "scope" | "authorizeReplay">;

/** The options of `idempotency()`: the store, the scope and the route's rules. */
export interface FastifyIdempotencyOptions
  extends LifecycleOptions<Tx>,
    Pick<AdapterOptions<[FastifyRequest]>, "scope" | "authorizeReplay"> {}

/**
 * The hooks `idempotency()` returns, to spread into a route's options. The hooks that wait for nothing
 * take Fastify's `done` callback rather than being async: Fastify then has no promise to wait for.
 */
export interface IdempotencyHooks {
  /** Keeps a copy of the raw body bytes (for the fingerprint) while Fastify's parsers read them. */
  preParsing: preParsingHookHandler;
  /** Claims the key and opens the transaction (`request.idempotency`), then lets the handler run. */
  preHandler: preHandlerAsyncHookHandler;
  /** A handler error rolls back. */
  onError: onErrorHookHandler;
  /** Hands the serialized reply to the engine, waits for the commit, sends what the engine chose. */
  onSend: onSendAsyncHookHandler<unknown>;
  /** A reply that skipped `onSend` (hijacked) rolls back rather than hold the transaction open. */
  onResponse: onResponseHookHandler;
}

/** A request whose handler runs inside a claim: the lifecycle waits for the reply `onSend` passes on. */
interface Pending {
  begun: Begun;
  reply(r: StoredResponse): void;
  fail(err: unknown): void;
  error?: unknown;
  done: Promise<StoredResponse>;
}

const encoder = new TextEncoder();

async function payloadBytes(payload: unknown): Promise<Uint8Array> {
  if (payload === null || payload === undefined) return new Uint8Array();
  if (typeof payload === "string") return encoder.encode(payload);
  if (payload instanceof Uint8Array) return payload;
  if (payload instanceof Response) return new Uint8Array(await payload.arrayBuffer());
  if (typeof payload === "object" && Symbol.asyncIterator in payload) {
    // a node or web stream: the saved answer needs all of it
    const chunks: Buffer[] = [];
    for await (const chunk of payload as AsyncIterable<Uint8Array | string>) chunks.push(Buffer.from(chunk));
    return Buffer.concat(chunks);
  }
  return encoder.encode(String(payload));
}

function setHeaders(reply: FastifyReply, headers: Array<[string, string]>): void {
  for (const name in reply.getHeaders()) reply.removeHeader(name);
  if (headers.length === 0) return;
  // One value per name (the usual case): set as they come; a repeated name (Set-Cookie) grouped.
  const seen = new Set<string>();
  for (const [name] of headers) {
    const lower = name.toLowerCase();
    if (seen.has(lower)) {
      for (const [n, values] of groupHeaders(headers))
        reply.header(n, values.length === 1 ? values[0] : values);
      return;
    }
    seen.add(lower);
  }
  for (const [name, value] of headers) reply.header(name, value);
}

/**
 * The handler's own reply with idem's headers added (an executed request: the lifecycle keeps the
 * handler's pairs, the same objects, and appends its own): only those are set, when none of their names
 * is set already. False for any other answer (a replay, a problem), which `setHeaders` writes whole.
 */
function addedHeaders(reply: FastifyReply, produced: StoredResponse, out: StoredResponse): boolean {
  const mine = produced.headers;
  const all = out.headers;
  if (out.body !== produced.body || all.length < mine.length) return false;
  for (let i = 0; i < mine.length; i++) if (all[i] !== mine[i]) return false;
  for (let i = mine.length; i < all.length; i++) if (reply.hasHeader(all[i]![0])) return false;
  for (let i = mine.length; i < all.length; i++) reply.header(all[i]![0], all[i]![1]);
  return true;
}

function send(reply: FastifyReply, r: StoredResponse): FastifyReply {
  setHeaders(reply, r.headers);
  return reply.code(r.status).send(bufferOf(r.body));
}

/** The lifecycle's view of a Fastify request (a class: no closures per request). */
class FastifyIdemRequest implements IdemRequest {
  readonly method: string;
  readonly path: string;
  constructor(private readonly request: FastifyRequest) {
    this.method = request.method;
    this.path = request.url;
  }
  header(name: string): string | undefined {
    const v = this.request.headers[name.toLowerCase()];
    return Array.isArray(v) ? v.join(", ") : v;
  }
}

/**
 * Keeps a copy of the raw body bytes (for the fingerprint) while Fastify's own parsers read them: a
 * `data` listener put first on the payload stream sees every chunk any reader takes, in order (flowing
 * `data` events, `read()` and async iteration all emit `data`). `prependListener` is EventEmitter's, not
 * Readable's `on`: it does not start the stream flowing, so the parser that comes later (which may rely
 * on its own `on("data")` to start it) finds the stream as Fastify left it. No Transform, no pipe.
 */
function rawBodyKeeper(rawBodies: WeakMap<FastifyRequest, Buffer[]>): preParsingHookHandler {
  return function preParsing(request, _reply, payload, done) {
    const chunks: Buffer[] = [];
    rawBodies.set(request, chunks);
    payload.prependListener("data", (chunk: Buffer | string) => {
      chunks.push(typeof chunk === "string" ? Buffer.from(chunk) : chunk); // a decoding preParsing stream
    });
    done(null, payload);
  };
}

/** The body to read: the bytes kept by preParsing, else whatever the parser left in request.body. */
function bodyOf(
  request: FastifyRequest,
  rawBodies: WeakMap<FastifyRequest, Buffer[]>,
): Uint8Array | RequestBody {
  const chunks = rawBodies.get(request);
  rawBodies.delete(request);
  if (chunks?.length) return chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
  const parsed: unknown = request.body;
  if (parsed instanceof Uint8Array) return parsed;
  if (typeof parsed === "string") return encoder.encode(parsed);
  return parsedBody(parsed);
}

/** Read the request once; answers 400/401 (or a failure) itself and returns undefined then. */
async function begin(
  lifecycle: Lifecycle<Tx>,
  options: FastifyRouteOptions,
  rawBodies: WeakMap<FastifyRequest, Buffer[]>,
  request: FastifyRequest,
  reply: FastifyReply,
): Promise<Exclude<Begun, { kind: "answer" }> | undefined> {
  const scope = await options.scope(request);
  const begun = lifecycle.begin(new FastifyIdemRequest(request), scope, bodyOf(request, rawBodies));
  if (begun.kind !== "answer") return begun;
  send(reply, begun.response);
  return undefined;
}

function authorizer(options: FastifyRouteOptions, request: FastifyRequest): RunOptions["authorize"] {
  const check = options.authorizeReplay;
  return check && (() => check(request));
}

/** The route hooks of a keyed route in atomic mode: spread them into the route's options. */
export function idempotency(options: FastifyIdempotencyOptions): IdempotencyHooks {
  checkRouteOptions("idempotency()", options, "atomic");
  const lifecycle = new Lifecycle<Tx>(options);
  const rawBodies = new WeakMap<FastifyRequest, Buffer[]>();
  const pending = new WeakMap<FastifyRequest, Pending>();

  return {
    preParsing: rawBodyKeeper(rawBodies),

    async preHandler(request, reply) {
      const begun = await begin(lifecycle, options, rawBodies, request, reply);
      if (!begun) return reply;

      // `work` must not finish before the handler has replied, but preHandler must return for the
      // handler to run: so work waits on a promise that onSend settles with the serialized reply.
      let entered!: () => void;
      const started = new Promise<undefined>((resolve) => {
        entered = () => resolve(undefined);
      });
      const p = { begun, error: undefined } as Pending;
      const produced = new Promise<StoredResponse>((resolve, reject) => {
        p.reply = resolve;
        p.fail = reject;
      });
      const key = begun.kind === "keyed" ? begun.claim.key : undefined;
      const scope = begun.kind === "keyed" ? begun.claim.scope : begun.scope;
      const body = begun.body.value;
      const work = (tx: Tx) => {
        // key and scope are undefined only on an unkeyed request of a `required: false` route, the
        // case FastifyIdempotency documents: keyed routes, the default, type them as the strings they are.
        request.idempotency = { tx, key, scope, body } as FastifyIdempotency;
        entered();
        return produced;
      };
      p.done =
        begun.kind === "keyed"
          ? lifecycle
              .keyed(begun, work, {
                signal: new SocketHangUp(request.raw.socket, reply.raw),
                authorize: authorizer(options, request),
              })
              .then((s) => s.response)
          : lifecycle.unkeyed(begun, work);
      // Either the claim succeeded and the handler may run, or the lifecycle answered without running
      // it (a replay, 409, 422), or the store failed before the claim (503 when the database is down).
      let early: StoredResponse | undefined;
      try {
        early = await Promise.race([started, p.done]);
      } catch (err) {
        const owed = lifecycle.failure(err, begun);
        if (!owed) throw err;
        early = owed;
      }
      if (early) return send(reply, early);
      pending.set(request, p);
    },

    onError(request, _reply, error, done) {
      const p = pending.get(request);
      if (p) p.error = error;
      done();
    },

    async onSend(request, reply, payload) {
      const p = pending.get(request);
      if (!p) return payload;
      pending.delete(request);
      const body = await payloadBytes(payload);
      const produced = { status: reply.statusCode, headers: headerPairs(reply.getHeaders()), body };
      if (p.error !== undefined) p.fail(p.error);
      else p.reply(produced);
      let out: StoredResponse;
      try {
        out = await p.done;
      } catch (err) {
        const owed = lifecycle.failure(err, p.begun); // the database went away
        if (owed) out = owed;
        else if (err === p.error)
          // rolled back; Fastify's error reply stands (as a Buffer: Fastify refuses a bare Uint8Array)
          return bufferOf(body);
        else {
          setHeaders(reply, []); // the store failed at commit: drop the handler's headers (Set-Cookie...)
          throw err;
        }
      }
      if (!addedHeaders(reply, produced, out)) setHeaders(reply, out.headers);
      reply.code(out.status);
      return bufferOf(out.body);
    },

    onResponse(request, _reply, done) {
      // A reply that skipped onSend (hijacked): roll back rather than hold the transaction open.
      const p = pending.get(request);
      if (!p) return done();
      pending.delete(request);
      p.fail(new Error("idem: the reply was sent without passing onSend (hijacked?); rolled back"));
      p.done.then(
        () => done(),
        () => done(),
      );
    },
  };
}

/**
 * The hooks as a plugin for every route registered beside it (wrapped in fastify-plugin, so it is not
 * encapsulated): `app.register(async (app) => { await app.register(idempotencyPlugin, opts);
 * app.post(...) }, { prefix: "/v1" })`.
 */
export const idempotencyPlugin = fp<FastifyIdempotencyOptions>(
  async function idempotencyPlugin(app, opts) {
    const hooks = idempotency(opts);
    app.decorateRequest("idempotency", null as unknown as FastifyIdempotency);
    app.addHook("preParsing", hooks.preParsing);
    app.addHook("preHandler", hooks.preHandler);
    app.addHook("onError", hooks.onError);
    app.addHook("onSend", hooks.onSend);
    app.addHook("onResponse", hooks.onResponse);
  },
  { name: "idem", fastify: "5.x" },
);

/** The options of `idempotentPhases()`: the runner, the input read from the request, the route's rules. */
export interface FastifyPhasesOptions<I>
  extends AdapterPhasesOptions<I, [FastifyRequest]>,
    Pick<AdapterOptions<[FastifyRequest]>, "scope" | "authorizeReplay"> {}

/**
 * A route in phases mode (a key is always required): spread it into the route's options.
 *
 *   app.post("/v1/payments", { preValidation: validate, ...idempotentPhases({ runner, scope, input }) })
 */
export function idempotentPhases<I>(options: FastifyPhasesOptions<I>): {
  preParsing: preParsingHookHandler;
  handler: RouteHandlerMethod;
} {
  checkRouteOptions("idempotentPhases()", options, "phases");
  const lifecycle = Lifecycle.forPhases<Tx>(options, options.answerWithinMs, options.runner.store);
  const rawBodies = new WeakMap<FastifyRequest, Buffer[]>();
  return {
    preParsing: rawBodyKeeper(rawBodies),
    async handler(request, reply) {
      const begun = await begin(lifecycle, options, rawBodies, request, reply);
      if (begun?.kind !== "keyed") return reply;
      let response: StoredResponse;
      try {
        const input = await options.input(request, begun.body.value);
        response = (
          await lifecycle.phases(begun, options.runner, input, {
            signal: new SocketHangUp(request.raw.socket, reply.raw),
            authorize: authorizer(options, request),
          })
        ).response;
      } catch (err) {
        const owed = lifecycle.failure(err, begun);
        if (!owed) throw err;
        response = owed;
      }
      return send(reply, response);
    },
  };
}
