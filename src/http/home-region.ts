/**
 * Home region, framework-free: every account (scope) belongs to one region, and its writes, hence its
 * idempotency keys, are only ever processed there. A request that lands in another region (DNS
 * failover, a load balancer, a travelling phone) is forwarded to the home region's service with the
 * same method, path, body, `Idempotency-Key` and credentials: never processed where it landed. So a
 * retry that changes region still meets its key, however far behind replication between the regions is.
 *
 *   const router = new HomeRegionRouter({
 *     region: "eu",
 *     homeOf: (account) => directory.homeOf(account),           // "eu" | "us"
 *     targets: { eu: "http://eu.internal:3000", us: "http://us.internal:3000" },
 *   });
 *   const reply = await router.handle(request, account);      // a Response, or undefined: serve it here
 *
 * When the home region does not answer, the caller gets `503 application/problem+json`
 * (`urn:idem:problem:home-region-unreachable`) with `Retry-After`: retryable with the same key; nothing
 * ran in this region. (If the request reached the home region before the answer was lost, the home may
 * have run it: the retry, forwarded again, replays it there.)
 *
 * Loops: a forwarded request carries `Via: 1.1 idem-<from region>`. A forwarded request that arrives in
 * a region which is not the account's home either (two regions disagree on the map, e.g. while an
 * account moves) is not forwarded again: it is answered 503 `home-region-loop`, retryable once the
 * maps agree.
 */
import {
  NOT_PROCESSED_RETRY,
  type OperationFields,
  OUTCOME_UNKNOWN_RETRY,
  problemResponse,
} from "../core/problem.ts";
import { toResponse } from "./fetch.ts";

/** Options of {@link HomeRegionRouter} (and of the framework middlewares built on it). */
export interface HomeRegionOptions {
  /** The region this instance runs in. Required. */
  region: string;
  /**
   * The home region of a scope (the authenticated account). `undefined`: the account has no home
   * region, and is served wherever it lands. Required.
   */
  homeOf: (scope: string) => string | undefined | Promise<string | undefined>;
  /**
   * Where each region's service answers: base URLs by region (`{ us: "http://us.internal:3000" }`), or
   * a function. The request's path and query are appended to the base. Required.
   */
  targets: Readonly<Record<string, string>> | ((region: string) => string | undefined);
  /**
   * The methods that go to the home region. Default: `POST`, `PUT`, `PATCH`, `DELETE` (writes; reads are
   * served where they land, from the local, possibly lagging, replica). Pass `"all"` to forward reads too.
   */
  methods?: readonly string[] | "all";
  /** How long to wait for the home region's answer, in milliseconds. Default: 10,000. */
  timeoutMs?: number;
  /** `Retry-After`, in seconds, of the 503 sent when the home region does not answer. Default: 1. */
  retryAfterSeconds?: number;
  /** The `fetch` to forward with. Default: the global `fetch`. */
  fetch?: typeof fetch;
  /** Called after each forward (for logs and metrics). Default: none. */
  onForward?: (event: ForwardEvent) => void;
}

/** One forwarded request, for logs and metrics (`onForward`). */
export interface ForwardEvent {
  /** The account. */
  scope: string;
  /** The region it arrived in (this one). */
  from: string;
  /** Its home region, where it was forwarded. */
  to: string;
  /** The status sent to the caller (the home region's, or 503 when it did not answer). */
  status: number;
  /** Why the home region did not answer, when it did not. */
  failure?: UnreachableReason;
  /** How long the forward took, in milliseconds. */
  ms: number;
}

/** Why a forward failed: no target configured, no connection or a broken one, or no answer in time. */
export type UnreachableReason = "no-target" | "network" | "timeout";

/** Where a request is processed: here, forwarded to its home region, or refused as a loop. */
export type HomeDecision =
  /** Serve the request here: this is the home region (or the account has none, or a read stays local). */
  | { kind: "local" }
  /** Forward it to `region`'s service at `target`. */
  | { kind: "forward"; region: string; target: string | undefined }
  /** It was forwarded here already, and this is not its home either: refuse rather than loop. */
  | { kind: "loop"; region: string };

/** The request to forward, as any framework can describe it. */
export interface ForwardRequest {
  /** The HTTP method. */
  method: string;
  /** Path with query string, e.g. `/v1/payments?expand=customer`. */
  path: string;
  /** The request's headers (hop-by-hop ones are dropped). */
  headers: Iterable<[string, string]>;
  /** The body bytes (ignored for GET and HEAD). */
  body?: Uint8Array;
  /** The client's signal: when it hangs up, the forward is abandoned too. */
  signal?: AbortSignal;
}

/** The problem code of a 503 when the home region did not answer. */
export const PROBLEM_HOME_UNREACHABLE = "home-region-unreachable";
/** The problem code of a request forwarded here that is not at home here either (a loop refused). */
export const PROBLEM_HOME_LOOP = "home-region-loop";

const DEFAULT_METHODS = ["POST", "PUT", "PATCH", "DELETE"];
/** Hop-by-hop headers (RFC 9110 §7.6.1) and those the forwarding connection sets itself. */
const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "proxy-authenticate",
  "proxy-authorization",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
  "host",
  "content-length",
]);
const VIA_PSEUDONYM = /(?:^|,)\s*(?:[\w.-]+\/)?[\w.-]+\s+idem-([\w.-]+)/g;

/** The regions a request already passed through (from the `Via` entries idem added). */
export function forwardedThrough(via: string | null | undefined): string[] {
  if (!via) return [];
  return [...via.matchAll(VIA_PSEUDONYM)].map((m) => m[1]!);
}

/** Decides where an account's request is processed, and forwards it to its home region. */
export class HomeRegionRouter {
  /** The region this instance runs in. */
  readonly region: string;
  private readonly options: HomeRegionOptions;
  private readonly methods: Set<string> | "all";

  constructor(options: HomeRegionOptions) {
    if (!/^[\w.-]+$/.test(options.region)) {
      throw new Error(`invalid region name ${JSON.stringify(options.region)}: use letters, digits, _ . -`);
    }
    this.options = options;
    this.region = options.region;
    this.methods =
      options.methods === "all" ? "all" : new Set((options.methods ?? DEFAULT_METHODS).map(upper));
  }

  /** Where the request of `scope` (undefined: not authenticated, served here) is processed. */
  async decide(scope: string | undefined, method: string, via?: string | null): Promise<HomeDecision> {
    if (scope === undefined) return { kind: "local" };
    if (this.methods !== "all" && !this.methods.has(upper(method))) return { kind: "local" };
    const home = await this.options.homeOf(scope);
    if (home === undefined || home === this.region) return { kind: "local" };
    if (forwardedThrough(via).length > 0) return { kind: "loop", region: home };
    return { kind: "forward", region: home, target: this.targetOf(home) };
  }

  private targetOf(region: string): string | undefined {
    const t = this.options.targets;
    return typeof t === "function" ? t(region) : Object.hasOwn(t, region) ? t[region] : undefined;
  }

  /**
   * Decide, and forward when the request belongs elsewhere: the response to send, or `undefined` when
   * the request is to be processed here.
   */
  async handle(request: Request, scope: string | undefined): Promise<Response | undefined> {
    const decision = await this.decide(scope, request.method, request.headers.get("via"));
    if (decision.kind === "local") return undefined;
    const url = new URL(request.url);
    const hasBody = request.method !== "GET" && request.method !== "HEAD";
    return this.send(decision, scope!, {
      method: request.method,
      path: url.pathname + url.search,
      headers: request.headers,
      body: hasBody ? new Uint8Array(await request.arrayBuffer()) : undefined,
      signal: request.signal,
    });
  }

  /** The answer for a request that is not processed here: the home region's reply, or a 503 problem. */
  async send(
    decision: Exclude<HomeDecision, { kind: "local" }>,
    scope: string,
    request: ForwardRequest,
  ): Promise<Response> {
    if (decision.kind === "loop") {
      return toResponse(
        problemResponse(
          503,
          PROBLEM_HOME_LOOP,
          `This request was forwarded here, but its account's home region is "${decision.region}": the ` +
            "regions disagree on the account's home. Nothing was processed; retry with the same key.",
          {
            headers: this.retryAfter(),
            fields: { home_region: decision.region, region: this.region },
            operation: NOT_PROCESSED_RETRY, // refused before anything ran anywhere
          },
        ),
      );
    }
    const started = performance.now();
    const done = (status: number, failure?: UnreachableReason) =>
      this.options.onForward?.({
        scope,
        from: this.region,
        to: decision.region,
        status,
        failure,
        ms: performance.now() - started,
      });
    if (decision.target === undefined) {
      done(503, "no-target");
      return this.unreachable(decision.region, "no-target", true);
    }
    try {
      const res = await this.forward(decision.target, request);
      done(res.status);
      return res;
    } catch (err) {
      if (request.signal?.aborted) throw err; // the client left: nobody to answer
      const reason: UnreachableReason = (err as Error)?.name === "TimeoutError" ? "timeout" : "network";
      done(503, reason);
      return this.unreachable(decision.region, reason, neverSent(err));
    }
  }

  /** Send the request to `target` (a base URL) and return its reply as it came, minus hop-by-hop headers. */
  async forward(target: string, request: ForwardRequest): Promise<Response> {
    const headers = new Headers();
    let via: string | undefined;
    const connectionTokens = new Set<string>();
    const pairs = [...request.headers];
    for (const [name, value] of pairs) {
      if (name.toLowerCase() === "connection") {
        for (const t of value.split(",")) connectionTokens.add(t.trim().toLowerCase());
      }
    }
    let host: string | undefined;
    for (const [name, value] of pairs) {
      const n = name.toLowerCase();
      if (n === "host") host = value;
      if (n === "via") via = via ? `${via}, ${value}` : value;
      if (HOP_BY_HOP.has(n) || connectionTokens.has(n) || n === "via" || n === "accept-encoding") continue;
      headers.append(n, value);
    }
    headers.set("via", (via ? `${via}, ` : "") + `1.1 idem-${this.region}`);
    const forwarded = `proto=${new URL(target).protocol.replace(":", "")}${host ? `;host="${host.replace(/["\\]/g, "")}"` : ""}`;
    headers.append("forwarded", forwarded);

    const timeout = AbortSignal.timeout(this.options.timeoutMs ?? 10_000);
    const signal = request.signal ? AbortSignal.any([timeout, request.signal]) : timeout;
    const method = upper(request.method);
    const res = await (this.options.fetch ?? fetch)(joinUrl(target, request.path), {
      method,
      headers,
      body: method === "GET" || method === "HEAD" ? undefined : (request.body as Uint8Array<ArrayBuffer>),
      redirect: "manual",
      signal,
    });
    // Read the whole reply here, so that a home region that dies mid-body is a 503 too, not a torn reply.
    const body = method === "HEAD" ? null : new Uint8Array(await res.arrayBuffer());
    const out = new Headers();
    for (const [name, value] of res.headers) {
      // fetch has decoded the body already: its encoding and length no longer apply.
      if (HOP_BY_HOP.has(name) || name === "content-encoding") continue;
      out.append(name, value);
    }
    out.append("via", `1.1 idem-${this.region}`);
    const nullBody = body === null || res.status === 204 || res.status === 304 || body.length === 0;
    return new Response(nullBody ? null : (body as Uint8Array<ArrayBuffer>), {
      status: res.status,
      headers: out,
    });
  }

  private retryAfter(): Array<[string, string]> {
    return [["retry-after", String(this.options.retryAfterSeconds ?? 1)]];
  }

  /**
   * The 503 for a home region that did not answer. `neverSent`: the request cannot have reached it (no
   * address, connection refused); otherwise (a timeout, a connection cut after sending) the home may
   * have run it, so only the same key is safe: its retry replays there.
   */
  private unreachable(region: string, reason: UnreachableReason, neverSent: boolean): Response {
    const operation: OperationFields = neverSent ? NOT_PROCESSED_RETRY : OUTCOME_UNKNOWN_RETRY;
    const what =
      reason === "no-target"
        ? "no address is configured for it"
        : reason === "timeout"
          ? "it did not answer in time"
          : "it could not be reached";
    return toResponse(
      problemResponse(
        503,
        PROBLEM_HOME_UNREACHABLE,
        `This account's writes are processed in its home region "${region}", and ${what}. Nothing was ` +
          "processed in this region; retry with the same Idempotency-Key.",
        {
          headers: this.retryAfter(),
          fields: { home_region: region, region: this.region, reason },
          operation,
        },
      ),
    );
  }
}

/** Whether a failed fetch cannot have sent the request (the connection was refused or not resolved). */
function neverSent(err: unknown): boolean {
  const code = (err as { cause?: { code?: unknown } } | null)?.cause?.code;
  return code === "ECONNREFUSED" || code === "ENOTFOUND" || code === "EAI_AGAIN";
}

function upper(s: string): string {
  return s.toUpperCase();
}

function joinUrl(base: string, path: string): string {
  return base.replace(/\/+$/, "") + (path.startsWith("/") ? path : `/${path}`);
}
