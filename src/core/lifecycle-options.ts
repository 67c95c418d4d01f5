/**
 * What a route tells the request lifecycle (lifecycle.ts): the request as the lifecycle reads it, the
 * route's options, compact storage, and what a phases route needs of its runner.
 */
import type { RequestBody } from "./body.ts";
import type { OutcomeEvent } from "./outcome.ts";
import type { SavePolicy, StoredResponse } from "./response.ts";
import type { AtomicOutcome, AtomicStore, Claim, CompactSaved, HangUp } from "./store.ts";

/** A request as the lifecycle sees it; each adapter builds one from its framework's request. */
export interface IdemRequest {
  /** The HTTP method, upper case. */
  method: string;
  /** Path with query string. */
  path: string;
  /** A request header by its lower-case name. */
  header(name: string): string | null | undefined;
}

/** What every route tells the request lifecycle: its store, its key rule, its fingerprint, its telemetry. */
export interface LifecycleOptions<Tx> extends SavePolicy {
  /** Where keys, saved answers and (in atomic mode) the work's transaction live. Required. */
  store: AtomicStore<Tx>;
  /** Answer 400 when a request has no `Idempotency-Key`. Default: `true`. */
  required?: boolean;
  /**
   * How requests are compared: by default SHA-256 over method, path and the body as read. Pass
   * `{ fields: ["amount_cents", "currency"] }` to compare selected body fields only, or a function.
   */
  fingerprint?: { fields: readonly string[] } | ((req: IdemRequest, body: RequestBody) => Uint8Array);
  /**
   * Form fields that may be sent more than once (their value is then an array, whose order counts).
   * Any other repeated form field, and any duplicate JSON key, is answered 400 before anything is
   * claimed. Default: none.
   */
  repeatable?: readonly string[];
  /** Response headers replayed with a saved answer. Default: `DEFAULT_REPLAYED_HEADERS`. Never Set-Cookie. */
  replayHeaders?: readonly string[];
  /** Called once per request with how it ended (for metrics and logs). Default: none. */
  onOutcome?: (event: OutcomeEvent) => void;
  /**
   * What a caller's W3C trace context (`traceparent`, `tracestate`, baggage) does to this route's
   * telemetry. `"continue"`: the request's spans are children of the caller's span (callers you trust:
   * your own services). `"link"`: each request starts a trace of its own, linked to the caller's span,
   * and neither the caller's trace, its tracestate nor its baggage reaches the request's spans or the
   * events its work writes (a route open to the internet). Default: `"continue"`.
   */
  traceContext?: TraceContextMode;
  /**
   * Compact storage for this route (atomic mode): save the status and the created resource's id instead
   * of the whole reply, and rebuild the reply from them on replay. Replays are then no longer byte for
   * byte: they are whatever `rebuild` makes of the resource now. Default: none (replies saved in full).
   */
  compact?: CompactOptions<Tx>;
  /**
   * Promise that the handler's only effects are its statements on the request's transaction (no call
   * to another system, no message sent, no file written before the work returns): then its first
   * statement is sent with the key's claim, in one round trip, instead of after the claim answered.
   * When the key turns out to be taken, those statements roll back, the handler's statements reject
   * with `AbandonedWorkError`, and the key's answer (a replay, 409 or 422) is given. Needs a pipelining
   * driver (`fromPg` on a `pg.Pool` made with `pipeline: true`); others run as without it. Not used
   * with `compact`. Default: `false`.
   */
  effectsInTxOnly?: boolean;
}

/** How a route takes a caller's trace context: continue it, or start its own trace linked to it. */
export type TraceContextMode = "continue" | "link";

/** How a route saves its replies in compact form and rebuilds them (see `LifecycleOptions.compact`). */
export interface CompactOptions<Tx> {
  /**
   * The id of the resource a saved answer created (e.g. the payment id), or undefined to save this
   * reply in full (e.g. a 402 decline that created nothing). Runs inside the work's transaction: if it
   * throws, the work rolls back.
   */
  id: (response: StoredResponse) => string | undefined;
  /**
   * The reply to replay for a key saved in compact form, from its status and resource id. Runs in the
   * replay's transaction (`tx`), so it may read the resource. The replay keeps the saved status and
   * only allow-listed headers, plus `Idempotent-Replayed: true`.
   */
  rebuild: (saved: CompactSaved, tx: Tx) => StoredResponse | Promise<StoredResponse>;
}

/** What a phases route needs of its runner (`definePhases` from `idem/postgres` returns one). */
export interface PhasesRunnerLike<I> {
  /** Claim the key, run (or resume) the phases on `input`, and answer as the key stands. */
  run(claim: Claim, input: I, options?: { signal?: HangUp; answerWithinMs?: number }): Promise<AtomicOutcome>;
  /** The runner's key store; when it can `inspect(scope, key)`, `authorizeReplay` runs before a resume. */
  readonly store?: unknown;
}

/** The options of a phases route's lifecycle: the runner holds the store, and a key is always required. */
export type PhasesLifecycleOptions = Omit<LifecycleOptions<unknown>, "store" | "required" | "compact">;

/**
 * The route options every adapter takes beside the lifecycle's, documented once here. `A` is what the
 * adapter hands its callbacks: its request (Express, Fastify, Node), Hono's `Context`, the request and
 * the handler's context (web), the event and the invocation's context (Lambda). An adapter takes the
 * ones it honours (`limit` and `onError` where it reads the body and answers a thrown error itself).
 */
export interface AdapterOptions<A extends unknown[]> {
  /** The caller's scope (their account id), from authentication, never from the body. Required. */
  scope: (...args: A) => string | undefined | Promise<string | undefined>;
  /**
   * Runs before a saved answer is replayed (or, in phases mode, an existing key resumed): false answers
   * 401 and sends nothing of the saved answer (e.g. the caller's API key was revoked meanwhile, or they
   * left the account). Default: none (the authentication before idem is the check).
   */
  authorizeReplay?: (...args: A) => boolean | Promise<boolean>;
  /**
   * The largest request body read, in bytes (with Express: when no body parser read it before); a
   * larger one is answered 413 problem+json. Default: 1 MiB.
   */
  limit?: number;
  /**
   * Called with an error the handler threw, after its transaction rolled back and before the 500
   * problem+json answer. Default: `console.error`.
   */
  onError?: (err: unknown, request: A[0]) => void;
}

/**
 * What a phases route takes in every adapter, beside its `AdapterOptions`: the runner, the runner's
 * input and the route's answer bound. `A` as in {@link AdapterOptions}.
 */
export interface AdapterPhasesOptions<I, A extends unknown[]> extends PhasesLifecycleOptions {
  /** The phases runner that does the work (`definePhases` from `idem/postgres`). Required. */
  runner: PhasesRunnerLike<I>;
  /**
   * The runner's input, from the (validated) request and the body as read once. It is stored as JSON
   * for the completer, and a retry that resumes the key runs on the first request's input. Throw an
   * `IdemError` (e.g. `InvalidBodyError`) to answer 400 before anything is claimed. Required.
   */
  input: (request: A[0], body: unknown, ...rest: A extends [unknown, ...infer R] ? R : []) => I | Promise<I>;
  /**
   * The route's answer bound in ms, published as `Idempotency-Answer-Within`: a request whose external
   * call is still running then is answered 409 in flight with Retry-After while the phase goes on (on
   * Lambda, an invocation's remaining time less `reserveMs` lowers it). Default: 5,000.
   */
  answerWithinMs?: number;
}
