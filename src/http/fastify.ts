/**
 * Fastify 5 adapter: `idempotency(options)` returns route hooks.
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
 * (`request.idempotency.tx`), then lets the handler run; `onSend` hands the serialized reply to the
 * engine, waits for the commit and sends what the engine chose. A handler error (`onError`) rolls back.
 */
import { Transform } from "node:stream";
import type {
  FastifyPluginAsync,
  FastifyReply,
  FastifyRequest,
  onErrorAsyncHookHandler,
  onResponseAsyncHookHandler,
  onSendAsyncHookHandler,
  preHandlerAsyncHookHandler,
  preParsingAsyncHookHandler,
} from "fastify";
import type { Tx } from "../core/db.ts";
import type { EngineOptions, IdemRequest, StoredResponse } from "../core/index.ts";
import { canonicalJson, IdempotencyEngine } from "../core/index.ts";
import { groupHeaders, hangUpSignal } from "./node.ts";

export interface FastifyIdempotency {
  /** The transaction of this request (atomic mode): do the work's writes here. */
  tx: Tx;
  /** The request's idempotency key, or undefined on an optional-key route called without one. */
  key: string | undefined;
  scope: string | undefined;
}

declare module "fastify" {
  interface FastifyRequest {
    /** Set by idem's idempotency hooks for the handler. */
    idempotency: FastifyIdempotency;
  }
}

export interface FastifyIdempotencyOptions extends EngineOptions<Tx> {
  /** The caller's scope (their account id), from authentication, never from the body. Required. */
  scope: (request: FastifyRequest) => string | undefined | Promise<string | undefined>;
}

export interface IdempotencyHooks {
  preParsing: preParsingAsyncHookHandler;
  preHandler: preHandlerAsyncHookHandler;
  onError: onErrorAsyncHookHandler;
  onSend: onSendAsyncHookHandler<unknown>;
  onResponse: onResponseAsyncHookHandler;
}

/** A request whose handler runs inside a claim: the engine waits for the reply `onSend` passes on. */
interface Pending {
  reply(r: StoredResponse): void;
  fail(err: unknown): void;
  error?: unknown;
  done: Promise<{ response: StoredResponse }>;
}

type Outcome = { response: StoredResponse };

const encoder = new TextEncoder();

async function payloadBytes(payload: unknown): Promise<Uint8Array> {
  if (payload === null || payload === undefined) return new Uint8Array();
  if (typeof payload === "string") return encoder.encode(payload);
  if (payload instanceof Uint8Array) return payload;
  if (payload instanceof Response) return new Uint8Array(await payload.arrayBuffer());
  if (typeof payload === "object" && Symbol.asyncIterator in payload) {
    // a node or web stream: the saved response needs all of it
    const chunks: Buffer[] = [];
    for await (const chunk of payload as AsyncIterable<Uint8Array | string>) chunks.push(Buffer.from(chunk));
    return Buffer.concat(chunks);
  }
  return encoder.encode(String(payload));
}

function setHeaders(reply: FastifyReply, headers: Array<[string, string]>): void {
  for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
  for (const [name, values] of groupHeaders(headers))
    reply.header(name, values.length === 1 ? values[0] : values);
}

function send(reply: FastifyReply, r: StoredResponse): FastifyReply {
  setHeaders(reply, r.headers);
  return reply.code(r.status).send(Buffer.from(r.body));
}

export function idempotency(options: FastifyIdempotencyOptions): IdempotencyHooks {
  const engine = new IdempotencyEngine<Tx>(options);
  const rawBodies = new WeakMap<FastifyRequest, Buffer[]>();
  const pending = new WeakMap<FastifyRequest, Pending>();

  /** The fingerprinted body: the bytes kept by preParsing, else whatever the parser left in request.body. */
  function bodyOf(request: FastifyRequest): { body: Uint8Array; contentType: string | undefined } {
    const contentType = request.headers["content-type"];
    const chunks = rawBodies.get(request);
    if (chunks?.length) return { body: Buffer.concat(chunks), contentType };
    const parsed: unknown = request.body;
    if (parsed === undefined || parsed === null) return { body: new Uint8Array(), contentType };
    if (parsed instanceof Uint8Array) return { body: parsed, contentType };
    if (typeof parsed === "string") return { body: encoder.encode(parsed), contentType };
    return { body: encoder.encode(canonicalJson(parsed)), contentType: "application/json" };
  }

  return {
    async preParsing(request, _reply, payload) {
      const chunks: Buffer[] = [];
      rawBodies.set(request, chunks);
      // Fastify compares receivedEncodedLength with Content-Length and the body limit: keep it current.
      const tap = Object.assign(
        new Transform({
          transform(chunk: Buffer, _encoding, callback) {
            chunks.push(chunk);
            tap.receivedEncodedLength =
              payload.receivedEncodedLength ?? tap.receivedEncodedLength + chunk.length;
            callback(null, chunk);
          },
        }),
        { receivedEncodedLength: 0 },
      );
      payload.on("error", (err) => tap.destroy(err));
      return payload.pipe(tap);
    },

    async preHandler(request, reply) {
      const scope = await options.scope(request);
      const { body, contentType } = bodyOf(request);
      rawBodies.delete(request);
      const req: IdemRequest = {
        method: request.method,
        path: request.url,
        header: (name) => {
          if (name.toLowerCase() === "content-type") return contentType;
          const v = request.headers[name.toLowerCase()];
          return Array.isArray(v) ? v.join(", ") : v;
        },
        body,
      };
      const prepared = engine.prepare(req, scope);
      if (prepared.kind === "answer") return send(reply, prepared.response);

      // `work` must not finish before the handler has replied, but preHandler must return for the
      // handler to run: so work waits on a promise that onSend settles with the serialized reply.
      let entered!: () => void;
      const started = new Promise<undefined>((resolve) => {
        entered = () => resolve(undefined);
      });
      const p = { error: undefined } as Pending;
      const produced = new Promise<StoredResponse>((resolve, reject) => {
        p.reply = resolve;
        p.fail = reject;
      });
      const key = prepared.kind === "claim" ? prepared.claim.key : undefined;
      const work = (tx: Tx) => {
        request.idempotency = { tx, key, scope };
        entered();
        return produced;
      };
      p.done =
        prepared.kind === "claim"
          ? engine.execute(prepared.claim, work, { signal: hangUpSignal(reply.raw) })
          : options.store.transaction(work, { scope }).then((response): Outcome => ({ response }));
      // Either the claim succeeded and the handler may run, or the engine answered without running it
      // (a replay, 409, 422). A store failure before the claim rejects here and Fastify answers 500.
      const early = await Promise.race([started, p.done]);
      if (early) return send(reply, early.response);
      pending.set(request, p);
    },

    async onError(request, _reply, error) {
      const p = pending.get(request);
      if (p) p.error = error;
    },

    async onSend(request, reply, payload) {
      const p = pending.get(request);
      if (!p) return payload;
      pending.delete(request);
      const body = await payloadBytes(payload);
      if (p.error !== undefined) p.fail(p.error);
      else p.reply({ status: reply.statusCode, headers: headerPairs(reply), body });
      let out: Outcome;
      try {
        out = await p.done;
      } catch (err) {
        if (err === p.error) return body; // rolled back; Fastify's error reply stands
        setHeaders(reply, []); // the store failed at commit: drop the handler's headers (Set-Cookie...)
        throw err;
      }
      setHeaders(reply, out.response.headers);
      reply.code(out.response.status);
      return Buffer.from(out.response.body);
    },

    async onResponse(request) {
      // A reply that skipped onSend (hijacked): roll back rather than hold the transaction open.
      const p = pending.get(request);
      if (!p) return;
      pending.delete(request);
      p.fail(new Error("idem: the reply was sent without passing onSend (hijacked?); rolled back"));
      await p.done.catch(() => {});
    },
  };
}

function headerPairs(reply: FastifyReply): Array<[string, string]> {
  const pairs: Array<[string, string]> = [];
  for (const [name, value] of Object.entries(reply.getHeaders())) {
    if (value === undefined) continue;
    for (const one of Array.isArray(value) ? value : [value]) pairs.push([name, String(one)]);
  }
  return pairs;
}

/**
 * The hooks as a plugin, for every route registered beside it (it is not encapsulated, like a plugin
 * wrapped in fastify-plugin): `app.register(async (app) => { await app.register(idempotencyPlugin, opts);
 * app.post(...) }, { prefix: "/v1" })`.
 */
export const idempotencyPlugin: FastifyPluginAsync<FastifyIdempotencyOptions> = Object.assign(
  async function idempotencyPlugin(app: Parameters<FastifyPluginAsync>[0], opts: FastifyIdempotencyOptions) {
    const hooks = idempotency(opts);
    app.decorateRequest("idempotency", null as unknown as FastifyIdempotency);
    app.addHook("preParsing", hooks.preParsing);
    app.addHook("preHandler", hooks.preHandler);
    app.addHook("onError", hooks.onError);
    app.addHook("onSend", hooks.onSend);
    app.addHook("onResponse", hooks.onResponse);
  },
  { [Symbol.for("skip-override")]: true, [Symbol.for("fastify.display-name")]: "idem" },
);
