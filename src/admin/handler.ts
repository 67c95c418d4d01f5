/**
 * The admin API: a framework-free `(request: Request) => Promise<Response>` over `Operations`, mountable
 * on any adapter that speaks the Fetch API (Hono's `app.all`, Next.js route handlers, Bun, Deno; Express
 * and Fastify through a Request bridge). Every request passes `authorize` first, which names the person
 * (recorded with each action) or refuses. Errors are `application/problem+json`.
 *
 *   GET  {base}/me                            who the token names
 *   GET  {base}/keys/find?ref=op_...  |  ?scope=S&key=K   a key's story (timeline, reviews, actions)
 *   GET  {base}/keys?state=needs_review|unfinished|expiring[&limit=N][&within_seconds=S]
 *   POST {base}/keys/settle  {ref | scope+key, note, resume+data? | answer:{status, body}}
 *   POST {base}/keys/forget  {ref | scope+key, reason}
 *   GET  {base}/outbox                        counts, lag_seconds, parked events
 *   POST {base}/outbox/requeue  {id | aggregate_id, reason?}
 *   GET  {base}/inbox                         parked messages of every consumer
 *   POST {base}/inbox/unpark    {consumer, message_id, reason?}
 *   GET  {base}/audit                         the last recorded run (404 before the first)
 *   POST {base}/audit                         run the checks now (recorded)
 *   GET  {base}/actions[?scope=S&key=K][&limit=N]   what people did, newest first
 *
 * Nothing the key rules refuse reaches the database: a scope or key with a control character, a query
 * value with one, a body string with a NUL is answered 400; a ref that does not open, 404 like an
 * unknown key. Failed authentications are limited per source (throttle.ts: 429 past the limit) and
 * recorded (`admin.auth-failed`, `admin.auth-limited` in the actions).
 */
import { isValidKey, isValidScope, PROBLEM_TYPE_BASE } from "../core/index.ts";
import { BadOperationRefError, InvalidKeyRefError, type KeyRef } from "../postgres/admin/key-admin.ts";
import { CannotForgetError } from "../postgres/admin/key-forget.ts";
import { NoOpenReviewError, type Settlement, SettlementRefusedError } from "../postgres/phases/review.ts";
import type { KeyListState, Operations } from "./operations.ts";
import { type AuthLimitOptions, AuthThrottle } from "./throttle.ts";

/** Who the request is from (the actor recorded with each action), or a refusal. */
export type Authorize = (
  request: Request,
) => string | Response | null | undefined | Promise<string | Response | null | undefined>;

/** Options of {@link adminHandler}. */
export interface AdminHandlerOptions {
  /** What the API does (`new Operations({ store })`). */
  operations: Operations;
  /**
   * Names the person behind a request (a non-empty string), or refuses it: `null`/`undefined` answers
   * 401, a `Response` is answered as is (e.g. a 403). Required: there is no unauthenticated mode.
   */
  authorize: Authorize;
  /** The path the API is mounted at. Default: `/admin/api`. */
  basePath?: string;
  /** Called with errors that are not the caller's fault (answered 500 without details). */
  onError?: (err: unknown) => void;
  /**
   * The request's source (the client's address) when the handler is not given it per request
   * (`AdminRequestInfo.source`). Failed authentications are limited and recorded per source. Default:
   * none (every request counts as the one source `"unknown"`). Trust a forwarded header only behind a
   * proxy that sets it.
   */
  source?: (request: Request) => string | undefined;
  /** The limit on failed authentications per source, or `false` for none. Default: 10 a minute. */
  authLimit?: AuthLimitOptions | false;
  /** Called with each failed (or refused) authentication, after it is recorded (logs, alerts). */
  onAuthFailure?: (event: { source: string; path: string; limited: boolean }) => void;
}

/** What the host knows of a request that a `Request` does not carry. */
export interface AdminRequestInfo {
  /** The client's address (e.g. Hono's `getConnInfo(c).remote.address`). */
  source?: string;
}

/** The admin API as a fetch handler: a `Request` in, a `Response` out (mount it in any framework). */
export type AdminHandler = (request: Request, info?: AdminRequestInfo) => Promise<Response>;

/** A problem+json answer. */
export function adminProblem(
  status: number,
  code: string,
  detail: string,
  headers: HeadersInit = {},
): Response {
  const body = { type: PROBLEM_TYPE_BASE + code, title: TITLES[status] ?? "Error", status, detail };
  return new Response(JSON.stringify(body), {
    status,
    headers: { ...headers, "content-type": "application/problem+json", "cache-control": "no-store" },
  });
}

const TITLES: Record<number, string> = {
  400: "Bad Request",
  401: "Unauthorized",
  403: "Forbidden",
  404: "Not Found",
  405: "Method Not Allowed",
  409: "Conflict",
  413: "Content Too Large",
  415: "Unsupported Media Type",
  422: "Unprocessable Content",
  429: "Too Many Requests",
  500: "Internal Server Error",
};

class BadRequest extends Error {}

const NO_KEY =
  "No live key by that name: never claimed, expired, forgotten, claimed again since that ref was given, or not a ref of this service.";

/** Whether `s` holds a control character (C0, DEL or C1): nothing the database should be asked about. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: the point is to find them
const hasControl = (s: string) => /[\u0000-\u001f\u007f-\u009f]/.test(s);

/** Whether a JSON value holds a NUL anywhere (PostgreSQL's text and jsonb refuse it). */
function holdsNul(v: unknown): boolean {
  if (typeof v === "string") return v.includes("\u0000");
  if (Array.isArray(v)) return v.some(holdsNul);
  if (v && typeof v === "object")
    return Object.entries(v).some(([k, x]) => k.includes("\u0000") || holdsNul(x));
  return false;
}

const MAX_BODY = 64 * 1024;
const json = (value: unknown, status = 200) =>
  new Response(JSON.stringify(value), {
    status,
    headers: { "content-type": "application/json", "cache-control": "no-store" },
  });

/**
 * The operations console's JSON API under `basePath`: every request is authorized first (`authorize`
 * names the person), and every change is recorded with that name (docs/operations.md lists the routes).
 */
export function adminHandler(options: AdminHandlerOptions): AdminHandler {
  const base = (options.basePath ?? "/admin/api").replace(/\/+$/, "");
  const ops = options.operations;
  const throttle = options.authLimit === false ? undefined : new AuthThrottle(options.authLimit);
  /** Record a failed or refused authentication (never failing the answer) and tell the hook. */
  const authFailed = async (source: string, path: string, limited: boolean) => {
    try {
      await ops.recordAuthFailure(source, path, limited);
    } catch (err) {
      options.onError?.(err);
    }
    options.onAuthFailure?.({ source, path, limited });
  };
  return async (request, info) => {
    const url = new URL(request.url);
    if (url.pathname !== base && !url.pathname.startsWith(`${base}/`)) {
      return adminProblem(404, "not-found", `No admin route for ${url.pathname}.`);
    }
    const path = url.pathname.slice(base.length).replace(/\/+$/, "") || "/";
    const source = (info?.source ?? options.source?.(request) ?? "unknown").slice(0, 200);
    const wait = throttle?.refused(source);
    if (wait && wait.waitSeconds > 0) {
      if (wait.firstRefusal) await authFailed(source, path, true);
      return adminProblem(
        429,
        "admin-auth-limited",
        `Too many failed admin authentications from ${source}: try again in ${wait.waitSeconds} s.`,
        { "retry-after": String(wait.waitSeconds) },
      );
    }
    let actor: string;
    try {
      const who = await options.authorize(request);
      const refused = who instanceof Response ? who.status === 401 || who.status === 403 : !who?.trim();
      if (refused) {
        throttle?.failed(source);
        await authFailed(source, path, false);
      }
      if (who instanceof Response) return who;
      if (typeof who !== "string" || !who.trim()) {
        return adminProblem(
          401,
          "admin-unauthorized",
          "Give the admin token: Authorization: Bearer <token>.",
          {
            "www-authenticate": 'Bearer realm="idem admin"',
          },
        );
      }
      actor = who.trim();
    } catch (err) {
      options.onError?.(err);
      return adminProblem(500, "internal-error", "Authorization failed; see the service's log.");
    }
    const q = (name: string) => url.searchParams.get(name) ?? undefined;
    const route = `${request.method} ${path}`;
    try {
      for (const [name, value] of url.searchParams) {
        if (hasControl(value)) throw new BadRequest(`${name} holds a control character`);
      }
      switch (route) {
        case "GET /me":
          return json({ actor });
        case "GET /keys/find": {
          const story = await ops.keyStory(keyRefOf({ ref: q("ref"), scope: q("scope"), key: q("key") }));
          if (!story) return adminProblem(404, "key-not-found", NO_KEY);
          return json(story);
        }
        case "GET /keys": {
          const state = q("state") ?? "needs_review";
          if (state !== "needs_review" && state !== "unfinished" && state !== "expiring") {
            throw new BadRequest("state takes needs_review, unfinished or expiring");
          }
          const within = q("within_seconds");
          const items = await ops.listKeys(state as KeyListState, {
            limit: positive("limit", q("limit")) ?? 100,
            withinMs:
              within === undefined ? undefined : positive("within_seconds", within, 366 * 86_400)! * 1000,
          });
          return json({ state, items });
        }
        case "POST /keys/settle": {
          const body = await readBody(request);
          const review = await ops.settle(keyRefOf(body), settlementOf(body), actor);
          return json({ review });
        }
        case "POST /keys/forget": {
          const body = await readBody(request);
          const reason = text(body.reason);
          if (!reason)
            throw new BadRequest("reason is required: say why the key is forgotten (it is recorded)");
          if (body.effect_reversed !== undefined && typeof body.effect_reversed !== "boolean") {
            throw new BadRequest("effect_reversed takes true (you reversed the key's effect) or false");
          }
          const effectReversed = body.effect_reversed === true;
          return json({ forgotten: await ops.forget(keyRefOf(body), actor, reason, { effectReversed }) });
        }
        case "GET /outbox":
          return json(await ops.outbox({ limit: positive("limit", q("limit")) }));
        case "POST /outbox/requeue": {
          const body = await readBody(request);
          const id = text(body.id);
          const aggregateId = text(body.aggregate_id);
          if (!id === !aggregateId) throw new BadRequest("give one of id or aggregate_id");
          if (id && !/^[0-9a-f-]{36}$/i.test(id)) throw new BadRequest("id takes an outbox event's UUID");
          const requeued = await ops.requeue(
            id ? { id } : { aggregateId: aggregateId! },
            actor,
            text(body.reason),
          );
          return json({ requeued });
        }
        case "GET /inbox":
          return json({
            parked: await ops.parkedMessages({
              consumer: q("consumer"),
              limit: positive("limit", q("limit")),
            }),
          });
        case "POST /inbox/unpark": {
          const body = await readBody(request);
          const consumer = text(body.consumer);
          const messageId = text(body.message_id);
          if (!consumer || !messageId) throw new BadRequest("give consumer and message_id");
          const unparked = await ops.unpark(consumer, messageId, actor, text(body.reason));
          if (!unparked) return adminProblem(404, "message-not-parked", "No such parked message.");
          return json({ unparked });
        }
        case "GET /audit": {
          const last = await ops.lastAudit();
          if (!last) return adminProblem(404, "no-audit-yet", "The audit has not run yet: POST to run it.");
          return json(last);
        }
        case "POST /audit":
          return json(await ops.runAudit(actor));
        case "GET /actions": {
          const scope = q("scope");
          const key = q("key");
          if (scope !== undefined && !isValidScope(scope)) throw new BadRequest("scope is not a scope");
          if (key !== undefined && !isValidKey(key)) throw new BadRequest("key is not an idempotency key");
          return json({
            actions: await ops.actions({
              scope,
              key,
              limit: positive("limit", q("limit")),
            }),
          });
        }
      }
      return adminProblem(404, "not-found", `No admin route for ${request.method} ${path}.`);
    } catch (err) {
      if (err instanceof BadRequest || err instanceof InvalidKeyRefError) {
        return adminProblem(400, "bad-request", err.message);
      }
      if (err instanceof BadOperationRefError) return adminProblem(404, "key-not-found", NO_KEY);
      if (err instanceof NoOpenReviewError) return adminProblem(409, "no-open-review", err.message);
      if (err instanceof SettlementRefusedError) return adminProblem(422, "settlement-refused", err.message);
      if (err instanceof CannotForgetError) return adminProblem(409, "cannot-forget", err.message);
      options.onError?.(err);
      return adminProblem(500, "internal-error", "The admin API failed; see the service's log.");
    }
  };
}

function text(v: unknown): string | undefined {
  return typeof v === "string" && v.trim() ? v.trim() : undefined;
}

function positive(name: string, v: string | undefined, max = 10_000): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!(Number.isInteger(n) && n > 0 && n <= max))
    throw new BadRequest(`${name} takes a whole number from 1 to ${max}`);
  return n;
}

function keyRefOf(v: Record<string, unknown>): KeyRef {
  const ref = text(v.ref);
  if (ref) return { ref };
  if (typeof v.scope === "string" && typeof v.key === "string" && v.scope && v.key) {
    return { scope: v.scope, key: v.key };
  }
  throw new BadRequest("give ref (an operation_ref) or scope and key");
}

function settlementOf(body: Record<string, unknown>): Settlement {
  const note = text(body.note);
  if (!note) throw new BadRequest("note is required: say what you found and where (it is recorded)");
  const resume = text(body.resume);
  if ((resume === undefined) === (body.answer === undefined)) {
    throw new BadRequest("give exactly one of resume (a phase) or answer ({status, body})");
  }
  if (resume !== undefined) {
    const data = body.data;
    if (data !== undefined && (typeof data !== "object" || data === null || Array.isArray(data))) {
      throw new BadRequest("data takes a JSON object");
    }
    return { resume, data: data as Record<string, unknown> | undefined, note };
  }
  const answer = body.answer as { status?: unknown; body?: unknown } | null;
  const status = Number(answer?.status);
  if (!(typeof answer === "object" && answer && Number.isInteger(status) && status >= 200 && status <= 599)) {
    throw new BadRequest("answer takes {status: 200 to 599, body: any JSON}");
  }
  return { answer: { status, body: answer.body ?? null }, note };
}

async function readBody(request: Request): Promise<Record<string, unknown>> {
  const type = request.headers.get("content-type") ?? "";
  if (!/^application\/json\b/i.test(type)) throw new BadRequest("send the body as application/json");
  const raw = await request.text();
  if (raw.length > MAX_BODY) throw new BadRequest(`the body is larger than ${MAX_BODY} bytes`);
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch {
    throw new BadRequest("the body is not JSON");
  }
  if (typeof v !== "object" || v === null || Array.isArray(v))
    throw new BadRequest("the body takes a JSON object");
  if (holdsNul(v)) throw new BadRequest("the body holds a NUL character, which cannot be stored");
  return v as Record<string, unknown>;
}
