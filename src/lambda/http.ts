/**
 * AWS Lambda behind API Gateway (REST and HTTP APIs), a Function URL or an Application Load Balancer:
 * `idempotency(handler, options)` wraps a handler as a keyed route in atomic mode, `idempotentPhases`
 * makes one in phases mode. Both return a Lambda handler `(event, context) => Promise<result>`, and
 * answer in the event's own result format (see events.ts); the lifecycle is the one every adapter uses.
 *
 *   const store = await PostgresStore.open(fromPg(new pg.Pool({ max: 1 }))); // once per container
 *   export const handler = idempotency(
 *     async (event, { tx, scope, body }) => {
 *       const payment = await insertPayment(tx, scope, body as PaymentInput);
 *       return { statusCode: 201, headers: { "content-type": "application/json" }, body: JSON.stringify(payment) };
 *     },
 *     { store, scope: (event) => accountOf(event) },
 *   );
 *
 * The invocation's remaining time bounds what it holds and when it answers (deadline.ts): past it, a
 * duplicate is answered 409 in flight instead of being cut off by Lambda's timeout, and a function that
 * timed out inside its transaction is rolled back by the database, so a retry takes the key over and
 * runs the work once.
 */
import type {
  AdapterOptions,
  AdapterPhasesOptions,
  Begun,
  LifecycleOptions,
  PhasesRunnerLike,
  RunOptions,
  Settled,
  StoredResponse,
  Tx,
} from "../core/index.ts";
import {
  checkRouteOptions,
  IdemError,
  IdemOptionsError,
  KeyInFlightError,
  Lifecycle,
  ProblemCode,
} from "../core/index.ts";
import { DEFAULT_BODY_LIMIT } from "../http/shared.ts";
import { DEFAULT_RESERVE_MS, Deadline, type LambdaContextLike } from "./deadline.ts";
import {
  bodyOf,
  EventRequest,
  type LambdaHttpEvent,
  type LambdaReply,
  resultOf,
  storedOf,
} from "./events.ts";

/**
 * What the handler gets. `Keyed` is false on a `required: false` route, where an event without a key
 * runs with `key` (and possibly `scope`) undefined; `Body` is the body's type when you know it.
 */
export interface LambdaIdempotencyContext<
  Ctx extends LambdaContextLike = LambdaContextLike,
  Body = unknown,
  Keyed extends boolean = true,
> {
  /** The transaction of this request (atomic mode): do the work's writes here. */
  tx: Tx;
  /** The request's idempotency key. */
  key: Keyed extends true ? string : string | undefined;
  /** The caller's scope, as the route's `scope` gave it. */
  scope: Keyed extends true ? string : string | undefined;
  /** The body as read once, and fingerprinted: parsed JSON, form fields, the raw bytes, or undefined. */
  body: Body;
  /** The body's bytes as received (base64 decoded). */
  rawBody: Uint8Array;
  /** Lambda's context object of this invocation. */
  lambda: Ctx;
}

/** The handler `idempotency()` wraps: it returns the result its event's source takes. */
export type LambdaIdempotentHandler<
  E extends LambdaHttpEvent = LambdaHttpEvent,
  Ctx extends LambdaContextLike = LambdaContextLike,
  Body = unknown,
  Keyed extends boolean = true,
> = (event: E, ctx: LambdaIdempotencyContext<Ctx, Body, Keyed>) => Promise<LambdaReply>;

/** The wrapped function: Lambda's handler shape. */
export type LambdaHttpHandler<
  E extends LambdaHttpEvent = LambdaHttpEvent,
  Ctx extends LambdaContextLike = LambdaContextLike,
> = (event: E, context: Ctx) => Promise<LambdaReply>;

/**
 * The route options of a Lambda handler: those every adapter takes (`AdapterOptions`, documented there;
 * the scope comes from the authorizer's claims), and the time kept back before the function's timeout.
 */
export interface LambdaRouteOptions<E, Ctx> extends AdapterOptions<[E, Ctx]> {
  /**
   * Time kept back, in ms, to send the answer before the function's timeout: a request still waiting
   * (on a duplicate, or its own work) this close to the timeout is answered 409 in flight, and its work
   * is not committed. Default: 500.
   */
  reserveMs?: number;
}

/** The options of `idempotency()`: the store, the scope and the route's rules. */
export interface LambdaIdempotencyOptions<E = LambdaHttpEvent, Ctx = LambdaContextLike>
  extends LifecycleOptions<Tx>,
    LambdaRouteOptions<E, Ctx> {}

/** The options of `idempotentPhases()`: the runner, the input read from the event, the route's rules. */
export interface LambdaPhasesOptions<I, E = LambdaHttpEvent, Ctx = LambdaContextLike>
  extends AdapterPhasesOptions<I, [E, Ctx]>,
    LambdaRouteOptions<E, Ctx> {}

type Run<E, Ctx> = (
  event: E,
  context: Ctx,
  begun: Begun & { kind: "keyed" | "unkeyed" },
  raw: Uint8Array,
  deadline: Deadline,
) => Promise<StoredResponse>;

/** Read the event, let `run` answer it by the deadline, and turn what escapes into idem's answer or a 500. */
function route<E extends LambdaHttpEvent, Ctx extends LambdaContextLike>(
  lifecycle: Lifecycle<Tx>,
  options: LambdaRouteOptions<E, Ctx>,
  run: Run<E, Ctx>,
): LambdaHttpHandler<E, Ctx> {
  const onError = options.onError ?? ((err: unknown) => console.error(err));
  const limit = options.limit ?? DEFAULT_BODY_LIMIT;
  const reserveMs = options.reserveMs ?? DEFAULT_RESERVE_MS;
  return async function idempotentLambda(event, context) {
    const deadline = new Deadline(context, reserveMs);
    const request = new EventRequest(event);
    let begun: Begun | undefined;
    try {
      const raw = bodyOf(event);
      if (raw.length > limit) {
        throw new IdemError(ProblemCode.BodyTooLarge, 413, `The request body is larger than ${limit} bytes.`);
      }
      const scope = await options.scope(event, context);
      begun = lifecycle.begin(request, scope, raw);
      if (begun.kind === "answer") return resultOf(request, begun.response);
      return resultOf(request, await answerBy(deadline, run(event, context, begun, raw, deadline)));
    } catch (err) {
      const owed = lifecycle.failure(err, begun); // 413, 409 at the deadline, or the database down
      if (owed) return resultOf(request, owed);
      onError(err, event); // the handler threw: the transaction rolled back, nothing was saved
      return resultOf(request, lifecycle.internalError(begun));
    }
  };
}

/**
 * The work's answer, or, when the deadline comes first, a `KeyInFlightError` (409, retry with the same
 * key). The work goes on until it notices: the store sees the deadline as a hang-up and commits nothing.
 */
function answerBy(deadline: Deadline, work: Promise<StoredResponse>): Promise<StoredResponse> {
  if (deadline.answerInMs() >= 2 ** 31 - 1) return work;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      deadline.answered = true;
      reject(new KeyInFlightError(1));
    }, deadline.answerInMs());
  });
  work.catch(() => {}); // answered already when it fails late: nothing to tell
  return Promise.race([work, late]).finally(() => clearTimeout(timer));
}

function runOptions<E, Ctx>(
  options: LambdaRouteOptions<E, Ctx>,
  event: E,
  context: Ctx,
  deadline: Deadline,
): RunOptions {
  const check = options.authorizeReplay;
  return { signal: deadline, authorize: check && (() => check(event, context)) };
}

/** Wrap a Lambda handler as a keyed route in atomic mode. */
export function idempotency<
  E extends LambdaHttpEvent = LambdaHttpEvent,
  Ctx extends LambdaContextLike = LambdaContextLike,
  Body = unknown,
>(
  handler: LambdaIdempotentHandler<E, Ctx, Body>,
  options: LambdaIdempotencyOptions<E, Ctx> & { required?: true },
): LambdaHttpHandler<E, Ctx>;
/** The same with `required: false`: an event without a key goes through, so `key` and `scope` may be undefined. */
export function idempotency<
  E extends LambdaHttpEvent = LambdaHttpEvent,
  Ctx extends LambdaContextLike = LambdaContextLike,
  Body = unknown,
>(
  handler: LambdaIdempotentHandler<E, Ctx, Body, false>,
  options: LambdaIdempotencyOptions<E, Ctx>,
): LambdaHttpHandler<E, Ctx>;
export function idempotency<E extends LambdaHttpEvent, Ctx extends LambdaContextLike>(
  handler: LambdaIdempotentHandler<E, Ctx, any, any>, // one of the two above; its key is checked by `required`
  options: LambdaIdempotencyOptions<E, Ctx>,
): LambdaHttpHandler<E, Ctx> {
  if (typeof handler !== "function") {
    throw new IdemOptionsError("idempotency()", "handler", "must be the Lambda handler function", handler);
  }
  checkRouteOptions("idempotency()", options, "atomic");
  const lifecycle = new Lifecycle<Tx>(options);
  return route(lifecycle, options, async (event, lambda, begun, rawBody, deadline) => {
    const body = begun.body.value;
    if (begun.kind === "unkeyed") {
      const scope = begun.scope;
      return lifecycle.unkeyed(begun, async (tx) => {
        await deadline.bound(tx);
        return storedOf(await handler(event, { tx, key: undefined, scope, body, rawBody, lambda }));
      });
    }
    const { scope, key } = begun.claim;
    const out: Settled = await lifecycle.keyed(
      begun,
      async (tx) => {
        await deadline.bound(tx);
        return storedOf(await handler(event, { tx, key, scope, body, rawBody, lambda }));
      },
      runOptions(options, event, lambda, deadline),
    );
    return out.response;
  });
}

/** A Lambda handler for a route in phases mode; a key is always required. */
export function idempotentPhases<
  I,
  E extends LambdaHttpEvent = LambdaHttpEvent,
  Ctx extends LambdaContextLike = LambdaContextLike,
>(options: LambdaPhasesOptions<I, E, Ctx>): LambdaHttpHandler<E, Ctx> {
  checkRouteOptions("idempotentPhases()", options, "phases");
  const lifecycle = Lifecycle.forPhases<Tx>(options, options.answerWithinMs, options.runner.store);
  const runner = options.runner;
  return route(lifecycle, options, async (event, lambda, begun, _raw, deadline) => {
    if (begun.kind !== "keyed") throw new Error("unreachable: phases routes require a key");
    const input = await options.input(event, begun.body.value, lambda);
    // The runner answers 409 in flight once its answer bound passes: never later than the deadline. Work
    // left running then is frozen with the function; its lease lapses and a retry takes the key over.
    const bounded: PhasesRunnerLike<I> = {
      store: runner.store,
      run: (claim, i, o) =>
        runner.run(claim, i, {
          ...o,
          answerWithinMs: Math.min(o?.answerWithinMs ?? Number.POSITIVE_INFINITY, deadline.answerInMs()),
        }),
    };
    const out = await lifecycle.phases(begun, bounded, input, runOptions(options, event, lambda, deadline));
    return out.response;
  });
}
