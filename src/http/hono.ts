/**
 * Hono adapter: `idempotency(options)` is a middleware for keyed routes.
 *
 *   app.post("/v1/payments", auth, validate, idempotency({ store, scope: (c) => c.var.accountId }), handler)
 *
 * Put validation before it, so that a bad request is answered without claiming the key. The handler
 * finds the transaction in `c.var.idempotency.tx`: its writes commit together with the saved response.
 */
import type { Context, MiddlewareHandler } from "hono";
import type { Tx } from "../core/db.ts";
import type { AtomicOutcome, Claim, EngineOptions, IdemRequest, StoredResponse } from "../core/index.ts";
import { errorResponse, IdempotencyEngine, KeyMissingError, Outcome } from "../core/index.ts";

export interface IdempotencyVariables {
  /** The transaction of this request (atomic mode): do the work's writes here. */
  tx: Tx;
  /** The request's idempotency key, or undefined on an optional-key route called without one. */
  key: string | undefined;
  scope: string | undefined;
}

declare module "hono" {
  interface ContextVariableMap {
    idempotency: IdempotencyVariables;
    /** How the keyed request ended (set by the middleware, for logs and metrics). */
    idempotencyOutcome: Outcome;
  }
}

export interface HonoIdempotencyOptions extends EngineOptions<Tx> {
  /** The caller's scope (their account id), from authentication, never from the body. Required. */
  scope: (c: Context) => string | undefined | Promise<string | undefined>;
}

const NULL_BODY = new Set([101, 204, 205, 304]);

function toResponse(r: StoredResponse): Response {
  const headers = new Headers();
  for (const [k, v] of r.headers) headers.append(k, v);
  return new Response(
    NULL_BODY.has(r.status) || r.body.length === 0 ? null : (r.body as Uint8Array<ArrayBuffer>),
    { status: r.status, headers },
  );
}

function setResponse(c: Context, r: StoredResponse): void {
  c.res = undefined; // otherwise Hono merges the previous response's headers into the new one
  c.res = toResponse(r);
}

export function idempotency(options: HonoIdempotencyOptions): MiddlewareHandler {
  const engine = new IdempotencyEngine<Tx>(options);
  return async function idempotencyMiddleware(c, next) {
    const scope = await options.scope(c);
    const url = new URL(c.req.url);
    const body = new Uint8Array(await c.req.arrayBuffer()); // Hono caches it: the handler can read it again
    const req: IdemRequest = {
      method: c.req.method,
      path: url.pathname + url.search,
      header: (name) => c.req.header(name),
      body,
    };
    const prepared = engine.prepare(req, scope);
    if (prepared.kind === "answer") {
      c.set("idempotencyOutcome", Outcome.Invalid);
      setResponse(c, prepared.response);
      return;
    }
    if (prepared.kind === "unkeyed") {
      c.set("idempotencyOutcome", Outcome.Unkeyed);
      await options.store.transaction(
        async (tx) => {
          c.set("idempotency", { tx, key: undefined, scope });
          await next();
          if (c.error) throw c.error;
        },
        { scope },
      );
      return;
    }
    const { claim } = prepared;
    try {
      const out = await engine.execute(
        claim,
        async (tx) => {
          c.set("idempotency", { tx, key: claim.key, scope });
          await next();
          if (c.error) throw c.error; // the handler threw: roll back; Hono's onError already answered
          const res = c.res;
          return {
            status: res.status,
            headers: [...res.headers],
            body: new Uint8Array(await res.arrayBuffer()),
          };
        },
        { signal: c.req.raw.signal },
      );
      c.set("idempotencyOutcome", out.outcome);
      setResponse(c, out.response);
    } catch (err) {
      if (err !== c.error) throw err;
    }
  };
}

/** What `idempotentPhases` needs of a phases runner (`definePhases` from `idem/postgres` returns one). */
export interface PhasesRunnerLike<I> {
  readonly store: EngineOptions<Tx>["store"];
  run(claim: Claim, input: I, options?: { signal?: AbortSignal }): Promise<AtomicOutcome>;
}

export interface HonoPhasesOptions<I> extends Omit<EngineOptions<Tx>, "store" | "required"> {
  /** The caller's scope (their account id), from authentication, never from the body. Required. */
  scope: (c: Context) => string | undefined | Promise<string | undefined>;
  /** The phases runner that does the work. Required. */
  runner: PhasesRunnerLike<I>;
  /** The runner's input, from the validated request (JSON: it is stored for the completer). Required. */
  input: (c: Context) => I | Promise<I>;
}

/**
 * Hono handler for a route in phases mode (recovery points, for work that calls other systems):
 *
 *   app.post("/v1/payments", auth, validate, idempotentPhases({ runner, scope, input: (c) => c.var.payment }))
 *
 * It ends the request: the answer is the runner's (saved and replayed when final), or a problem (422,
 * 409 with Retry-After, 503 retryable). A key is always required. The client's disconnect does not stop
 * the phases once they began.
 */
export function idempotentPhases<I>(options: HonoPhasesOptions<I>): MiddlewareHandler {
  const engine = new IdempotencyEngine<Tx>({ ...options, store: options.runner.store, required: true });
  return async function idempotentPhasesHandler(c) {
    const scope = await options.scope(c);
    const url = new URL(c.req.url);
    const req: IdemRequest = {
      method: c.req.method,
      path: url.pathname + url.search,
      header: (name) => c.req.header(name),
      body: new Uint8Array(await c.req.arrayBuffer()),
    };
    const prepared = engine.prepare(req, scope);
    if (prepared.kind !== "claim") {
      c.set("idempotencyOutcome", Outcome.Invalid);
      // A key is required here, so "unkeyed" cannot happen; "answer" is a 400/401.
      setResponse(c, prepared.kind === "answer" ? prepared.response : errorResponse(new KeyMissingError()));
      return c.res;
    }
    const input = await options.input(c);
    const out = await engine.settle(prepared.claim, () =>
      options.runner.run(prepared.claim, input, { signal: c.req.raw.signal }),
    );
    c.set("idempotencyOutcome", out.outcome);
    setResponse(c, out.response);
    return c.res;
  };
}
