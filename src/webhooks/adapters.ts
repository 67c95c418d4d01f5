/**
 * The receiver on each framework: read the raw body before any parser, hand it to `receive`, write
 * the answer. No framework is imported (its objects are typed by the few members used here), so
 * `idem/webhooks` needs none installed.
 *
 * A signature covers bytes; a body parser that ran first leaves a parsed value whose re-serialisation
 * is other bytes. Where the bytes are gone (Express's `json()` in front, Fastify's JSON parser, Nest
 * without `rawBody: true`, Hono after `c.req.json()`) the delivery is answered 500 with a
 * `WebhookBodyParsedError` that says how to fix the setup, never as a signature mismatch.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { StoredResponse } from "../core/response.ts";
import { toResponse } from "../http/fetch.ts";
import { readBody } from "../http/shared.ts";
import { WebhookBodyParsedError } from "./errors.ts";
import type { WebhookInput } from "./scheme.ts";

/** What the adapters need of a receiver. */
export interface Receives {
  receive(input: Omit<WebhookInput, "nowS">): Promise<StoredResponse>;
  /** The answer to a setup that parsed the body first (reported through `onError`). */
  misconfigured(err: WebhookBodyParsedError): StoredResponse;
  readonly limit: number;
}

/** How to fix each framework's setup when its parser took the body first. */
export const BODY_PARSED_FIX = {
  fetch:
    "the request's body was read before the webhook receiver got it: pass the Request on untouched (no request.json() or clone-less read before)",
  hono: "the body was parsed before the webhook receiver (c.req.json(), a validator): mount receiver.hono() on the route before anything reads the body",
  node: "the request's body was read before the webhook receiver: hand it the request before reading the body",
  express:
    "a body parser (express.json() or similar) ran before the webhook receiver, so the signed bytes are gone: register the webhook route before app.use(express.json()), or mount express.raw({ type: '*/*' }) on it, or keep the bytes with express.json({ verify: (req, _res, buf) => { req.rawBody = buf } })",
  fastify:
    "Fastify's JSON parser ran before the webhook receiver: register it as a plugin, app.register(receiver.fastify, { path }), which reads the raw bytes in its own scope (or use fastify-raw-body)",
  nest: "NestJS parsed the body before the webhook receiver: create the app with NestFactory.create(AppModule, { rawBody: true }) so that req.rawBody keeps the signed bytes",
} as const;

const encoder = new TextEncoder();
const tooLarge = (limit: number): StoredResponse => ({
  status: 413,
  headers: [["content-type", "application/problem+json"]],
  body: encoder.encode(
    JSON.stringify({
      type: "urn:idem:problem:body-too-large",
      title: "Content Too Large",
      status: 413,
      detail: `The request body is larger than ${limit} bytes.`,
    }),
  ),
});

/** Bytes kept by a raw-body option (`req.rawBody`: Nest, fastify-raw-body, an Express `verify`). */
function bytesOf(value: unknown): Uint8Array | undefined {
  if (value instanceof Uint8Array) return value;
  if (typeof value === "string") return encoder.encode(value);
  return undefined;
}

/** Web `Request` -> `Response`: Next.js route handlers, Bun, Deno, Workers, Hono's `c.req.raw`. */
export async function receiveFetch(
  r: Receives,
  request: Request,
  fix: string = BODY_PARSED_FIX.fetch,
): Promise<Response> {
  if (request.bodyUsed) return toResponse(r.misconfigured(new WebhookBodyParsedError(fix)));
  if (Number(request.headers.get("content-length")) > r.limit) return toResponse(tooLarge(r.limit));
  const body = new Uint8Array(await request.arrayBuffer());
  if (body.length > r.limit) return toResponse(tooLarge(r.limit));
  return toResponse(await r.receive({ header: (name) => request.headers.get(name) ?? undefined, body }));
}

/** The members of Hono's `Context` used here. */
export interface HonoLikeContext {
  /** `bodyCache`: what Hono's `c.req.json()`/`text()`/`arrayBuffer()` read (promises at run time). */
  req: { raw: Request; bodyCache?: object };
}

/** Hono: the raw request, or the bytes Hono cached when something read them with `arrayBuffer()`/`text()`. */
export async function receiveHono(r: Receives, c: HonoLikeContext): Promise<Response> {
  const cache = (c.req.bodyCache ?? {}) as Partial<Record<string, Promise<unknown>>>;
  const cached = cache.arrayBuffer ?? cache.text;
  if (cached) {
    const value = await cached;
    const body = typeof value === "string" ? encoder.encode(value) : new Uint8Array(value as ArrayBuffer);
    if (body.length > r.limit) return toResponse(tooLarge(r.limit));
    return toResponse(await r.receive({ header: (name) => c.req.raw.headers.get(name) ?? undefined, body }));
  }
  if (Object.keys(cache).length > 0)
    return toResponse(r.misconfigured(new WebhookBodyParsedError(BODY_PARSED_FIX.hono)));
  return receiveFetch(r, c.req.raw, BODY_PARSED_FIX.hono);
}

/** A Node request as Express and Nest (on Express) hand it: maybe with a parsed `body` or a `rawBody`. */
export type NodeLikeRequest = IncomingMessage & { body?: unknown; rawBody?: unknown };

function headerOf(req: IncomingMessage): (name: string) => string | undefined {
  return (name) => {
    const v = req.headers[name];
    return Array.isArray(v) ? v[0] : v;
  };
}

function writeNode(res: ServerResponse, answer: StoredResponse): void {
  res.writeHead(answer.status, Object.fromEntries(answer.headers));
  res.end(answer.body);
}

/** node:http (and Express, Nest on Express): the kept raw bytes, a Buffer body, or the stream read here. */
export async function receiveNode(
  r: Receives,
  req: NodeLikeRequest,
  res: ServerResponse,
  fix: string = BODY_PARSED_FIX.node,
): Promise<void> {
  let body = bytesOf(req.rawBody) ?? (req.body instanceof Uint8Array ? req.body : undefined);
  if (!body) {
    if (req.body !== undefined || req.readableEnded)
      return writeNode(res, r.misconfigured(new WebhookBodyParsedError(fix)));
    try {
      body = await readBody(req, r.limit);
    } catch (err) {
      if ((err as { status?: number }).status === 413) return writeNode(res, tooLarge(r.limit));
      res.destroy(); // the sender went away mid-body: nobody to answer, nothing done
      return;
    }
  }
  if (body.length > r.limit) return writeNode(res, tooLarge(r.limit));
  writeNode(res, await r.receive({ header: headerOf(req), body }));
}

/** The members of a Fastify request and reply used here. */
export interface FastifyLikeRequest {
  headers: Record<string, string | string[] | undefined>;
  body?: unknown;
  rawBody?: unknown;
}
export interface FastifyLikeReply {
  code(status: number): FastifyLikeReply;
  headers(values: Record<string, string>): FastifyLikeReply;
  send(payload: Uint8Array): unknown;
}
/** The members of a Fastify instance used by the plugin. */
export interface FastifyLikeInstance {
  removeAllContentTypeParsers(): void;
  addContentTypeParser(
    type: string,
    options: { parseAs: "buffer"; bodyLimit?: number },
    parser: (req: unknown, body: Buffer, done: (err: Error | null, body?: Buffer) => void) => void,
  ): void;
  post(
    path: string,
    handler: (request: FastifyLikeRequest, reply: FastifyLikeReply) => Promise<unknown>,
  ): unknown;
}

/** Fastify's request and reply: the bytes its raw parser (or `rawBody`) kept. */
export async function receiveFastify(
  r: Receives,
  request: FastifyLikeRequest,
  reply: FastifyLikeReply,
  fix: string = BODY_PARSED_FIX.fastify,
): Promise<unknown> {
  const body = bytesOf(request.rawBody) ?? (request.body instanceof Uint8Array ? request.body : undefined);
  const answer = body
    ? body.length > r.limit
      ? tooLarge(r.limit)
      : await r.receive({
          header: (name) => {
            const v = request.headers[name];
            return Array.isArray(v) ? v[0] : v;
          },
          body,
        })
    : r.misconfigured(new WebhookBodyParsedError(fix));
  return reply.code(answer.status).headers(Object.fromEntries(answer.headers)).send(answer.body);
}

/** A Fastify plugin: in its own scope every body is read as bytes, and `path` takes POSTs. */
export function fastifyPlugin(r: Receives) {
  return async (instance: FastifyLikeInstance, options: { path?: string }): Promise<void> => {
    instance.removeAllContentTypeParsers();
    instance.addContentTypeParser("*", { parseAs: "buffer", bodyLimit: r.limit }, (_req, body, done) =>
      done(null, body),
    );
    instance.post(options.path ?? "/", (request, reply) => receiveFastify(r, request, reply));
  };
}

/** NestJS on Express or on Fastify (`@Req()` and `@Res()`); the app must keep `rawBody`. */
export function receiveNest(r: Receives, req: unknown, res: unknown): Promise<unknown> {
  const reply = res as Partial<FastifyLikeReply> & { raw?: unknown };
  if (reply.raw !== undefined && typeof reply.code === "function") {
    return receiveFastify(r, req as FastifyLikeRequest, reply as FastifyLikeReply, BODY_PARSED_FIX.nest);
  }
  return receiveNode(r, req as NodeLikeRequest, res as ServerResponse, BODY_PARSED_FIX.nest);
}
