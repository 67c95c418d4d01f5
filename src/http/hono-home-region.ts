/**
 * Hono middleware for home-region routing (see `home-region.ts`): put it after authentication and
 * before `idempotency`, so that a request for an account homed elsewhere is forwarded there with its
 * key instead of being claimed and run here.
 *
 *   app.post(
 *     "/v1/payments",
 *     auth,
 *     homeRegion({ region: "eu", homeOf, targets, scope: (c) => c.var.accountId }),
 *     validate,
 *     idempotency({ store, scope: (c) => c.var.accountId }),
 *     handler,
 *   );
 */
import type { Context, MiddlewareHandler } from "hono";
import { type HomeRegionOptions, HomeRegionRouter } from "./home-region.ts";

export {
  type ForwardEvent,
  type ForwardRequest,
  forwardedThrough,
  type HomeDecision,
  type HomeRegionOptions,
  HomeRegionRouter,
  PROBLEM_HOME_LOOP,
  PROBLEM_HOME_UNREACHABLE,
  type UnreachableReason,
} from "./home-region.ts";

/** Options of {@link homeRegion}: the router's, and how to read the caller's scope. */
export interface HonoHomeRegionOptions extends HomeRegionOptions {
  /** The caller's scope (their account id), from authentication. Required. */
  scope: (c: Context) => string | undefined | Promise<string | undefined>;
}

declare module "hono" {
  interface ContextVariableMap {
    /** Set by `homeRegion` when it forwarded the request: the region that processed it. */
    homeRegionForwardedTo: string;
  }
}

/**
 * Hono middleware: a write of an account whose home is another region is forwarded there, and its
 * answer returned; anything else goes on to the next handler.
 */
export function homeRegion(options: HonoHomeRegionOptions): MiddlewareHandler {
  const router = new HomeRegionRouter(options);
  return async function homeRegionMiddleware(c, next) {
    const scope = await options.scope(c);
    const decision = await router.decide(scope, c.req.method, c.req.header("via"));
    if (decision.kind === "local") return next();
    const url = new URL(c.req.url);
    const method = c.req.method.toUpperCase();
    // Hono caches the body: were the request processed here after all, the handler could still read it.
    const body =
      method === "GET" || method === "HEAD" ? undefined : new Uint8Array(await c.req.arrayBuffer());
    c.set("homeRegionForwardedTo", decision.region);
    return router.send(decision, scope!, {
      method,
      path: url.pathname + url.search,
      headers: c.req.raw.headers,
      body,
      signal: c.req.raw.signal,
    });
  };
}
