/**
 * The client's spans: one `idem.intent` span per call (kind INTERNAL: the logical operation), with one
 * HTTP client span per attempt, named and described as the stable HTTP semantic conventions ask: its
 * name the method (`POST`), `http.request.method`, `server.address`, `server.port`, `url.full` (without
 * credentials), `http.response.status_code`, `error.type` for a 4xx, a 5xx or a network failure, and
 * `http.request.resend_count` on every resend. Its W3C trace context is sent in the attempt's
 * `traceparent` header, so the server's spans nest under the attempt that reached it. Each wait before
 * a retry is an `idem.retry` event on the intent span with its reason and its delay in seconds; a
 * give-up sets `idem.give_up.reason`. idem's own attributes are all under `idem.`. The
 * `idem.client.attempts` histogram counts attempts per intent.
 *
 * The attempt loop asks the client's hook (`clientObserver`, installed into `src/client/observe.ts`)
 * once per call (undefined without `@opentelemetry/api`) and then takes its hooks, which feed the spans
 * from the events the loop already emits.
 */
import { classifyNetworkError } from "../client/answer.ts";
import type { CircuitBreaker } from "../client/breaker.ts";
import type { RetryBudget } from "../client/budget.ts";
import { type ClientHooks, emit } from "../client/events.ts";
import type { ClientObserver, ObservedCall } from "../client/observe.ts";
import { keyAttributes } from "./keys.ts";
import { type Context, failSpan, instrument, type OtelApi, otel, type Span, tracer } from "./otel.ts";

/** Why an attempt is retried: its status, or what the network did. */
function reasonOf(status: number | undefined, error: unknown): string {
  if (status !== undefined) return String(status);
  if (error instanceof Error && (error.name === "TimeoutError" || error.name === "AbortError"))
    return "timeout";
  return classifyNetworkError(error);
}

export class IntentTrace {
  readonly #api: OtelApi;
  readonly #span: Span;
  readonly #ctx: Context;
  #attempt: Span | undefined;
  #ended = false;

  constructor(
    api: OtelApi,
    call: ObservedCall,
    breaker: CircuitBreaker | undefined,
    budget: RetryBudget | undefined,
  ) {
    this.#api = api;
    const parent = api.context.active();
    this.#span = tracer(api).startSpan("idem.intent", { kind: api.SpanKind.INTERNAL }, parent);
    if (this.#span.isRecording()) {
      this.#span.setAttributes({
        "http.request.method": methodOf(call.method),
        "url.full": fullUrl(call.url),
        ...keyAttributes(undefined, call.key),
        ...(breaker && { "idem.client.breaker.state": breaker.state }),
        ...(budget && { "idem.client.budget.tokens": budget.tokens }),
      });
    }
    this.#ctx = api.trace.setSpan(parent, this.#span);
  }

  /** Start attempt `n` (1-based): its span, and the call's headers with its trace context. */
  attempt(n: number, call: ObservedCall): Record<string, string> {
    const api = this.#api;
    const method = methodOf(call.method);
    const span = tracer(api).startSpan(
      method === OTHER ? "HTTP" : method,
      { kind: api.SpanKind.CLIENT },
      this.#ctx,
    );
    this.#attempt = span;
    if (span.isRecording()) {
      span.setAttributes({
        "http.request.method": method,
        ...(method === OTHER && { "http.request.method_original": call.method }),
        ...serverOf(call.url),
        "url.full": fullUrl(call.url),
        "idem.attempt": n,
      });
      if (n > 1) span.setAttribute("http.request.resend_count", n - 1);
    }
    const headers = { ...call.headers };
    api.propagation.inject(api.trace.setSpan(this.#ctx, span), headers);
    return headers;
  }

  #endAttempt(status: number | undefined, error: unknown, retryable: boolean): void {
    const span = this.#attempt;
    if (!span) return;
    this.#attempt = undefined;
    if (status !== undefined) {
      span.setAttribute("http.response.status_code", status);
      // A client span's 4xx and 5xx are errors (the conventions' span status for HTTP clients).
      if (status >= 400) {
        span.setAttribute("error.type", String(status));
        span.setStatus({ code: this.#api.SpanStatusCode.ERROR });
      }
    } else if (error !== undefined) {
      span.setAttribute("error.type", reasonOf(undefined, error));
      failSpan(this.#api, span, error);
    }
    span.setAttribute("idem.retryable", retryable);
    span.end();
  }

  #end(attempts: number, giveUp: Error | undefined): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#endAttempt(undefined, giveUp, false);
    const span = this.#span;
    span.setAttribute("idem.client.attempts", attempts);
    if (giveUp) {
      span.setAttribute("idem.give_up.reason", (giveUp as { code?: string }).code ?? giveUp.name);
      failSpan(this.#api, span, giveUp);
    }
    span.end();
    instrument(this.#api, "client.attempts", (m) =>
      m.createHistogram("idem.client.attempts", {
        unit: "{attempt}",
        description: "Attempts sent per intent, until its answer or giving up",
        advice: { explicitBucketBoundaries: [1, 2, 3, 4, 5, 8, 13] },
      }),
    ).record(attempts, { outcome: giveUp ? "gave_up" : "done" });
  }

  /** The user's hooks, also feeding this intent's spans. */
  hooks(user: ClientHooks): Required<ClientHooks> {
    return {
      attempt: (e) => {
        this.#endAttempt(e.status, e.error, e.retryable);
        emit(user.attempt, e);
      },
      wait: (e) => {
        this.#span.addEvent("idem.retry", {
          "idem.attempt": e.attempt,
          "idem.retry.reason": reasonOf(e.status, e.error),
          "idem.retry.delay": e.delayMs / 1000, // seconds, as the conventions measure time
          "idem.retry.delay_source": e.source,
        });
        emit(user.wait, e);
      },
      giveUp: (e) => {
        this.#end(e.attempts, e.error);
        emit(user.giveUp, e);
      },
      done: (e) => {
        this.#span.setAttribute("http.response.status_code", e.status);
        this.#end(e.attempts, undefined);
        emit(user.done, e);
      },
    };
  }
}

/** The methods the HTTP conventions know by name; any other is `_OTHER` (with the original beside it). */
const METHODS = new Set(["CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"]);
const OTHER = "_OTHER";

function methodOf(method: string): string {
  return METHODS.has(method) ? method : OTHER;
}

/** `server.address` and `server.port` of a URL (the scheme's default port when none is written). */
function serverOf(url: string): Record<string, string | number> {
  try {
    const u = new URL(url);
    const port = u.port
      ? Number(u.port)
      : u.protocol === "https:"
        ? 443
        : u.protocol === "http:"
          ? 80
          : undefined;
    const address = u.hostname.replace(/^\[(.*)\]$/, "$1");
    return port === undefined
      ? { "server.address": address }
      : { "server.address": address, "server.port": port };
  } catch {
    return {};
  }
}

/** `url.full` without credentials (the conventions ask for user:password to be redacted). */
function fullUrl(url: string): string {
  try {
    const u = new URL(url);
    if (!u.username && !u.password) return url;
    u.username = "REDACTED";
    u.password = "REDACTED";
    return u.href;
  } catch {
    return url;
  }
}

/** The client's observer: an `idem.intent` span per call when `@opentelemetry/api` is there. */
export const clientObserver: ClientObserver = {
  intent(call, user, breaker, budget) {
    const api = otel();
    if (!api) return undefined;
    const trace = new IntentTrace(api, call, breaker, budget);
    return { hooks: trace.hooks(user), attempt: (n, c) => trace.attempt(n, c) };
  },
};
