/**
 * The server side's spans and metrics: one `idem.request` span per keyed request, with its
 * `idem.claim` (how long the key's lock was waited for, and what the claim found), `idem.work` (the
 * handler) and `idem.save` (the saved answer and the commit) children; and the request metrics.
 *
 * The request span's parent is the active span (the application's HTTP server span, when it has HTTP
 * instrumentation), else the W3C trace context of the request's own `traceparent` header, so a client
 * that sends one (idem's client does) sees the server's spans in its trace with nothing else set up.
 * A route with `traceContext: "link"` (one open to the internet) starts a new trace for each request
 * instead, linked to that span, and drops the caller's baggage: nothing of the caller's context flows
 * into the request's spans, nor into the events its work writes (messaging.ts).
 *
 * Installed into the core's lifecycle by the HTTP adapters (`installServerTelemetry`); it does nothing
 * until `@opentelemetry/api` is found, and nothing but a map lookup until a provider records.
 */
import { isIdemError } from "../core/errors.ts";
import { type LifecycleObserver, setLifecycleObserver } from "../core/observe.ts";
import { Outcome, outcomeOfError, type Settled } from "../core/outcome.ts";
import type { AtomicOutcome, Claim } from "../core/store.ts";
import { keyAttributes } from "./keys.ts";
import {
  type Context,
  extractFrom,
  failSpan,
  instrument,
  type OtelApi,
  otel,
  type Span,
  type SpanContext,
  tracer,
} from "./otel.ts";

/** What the claim found, as `idem.claim.outcome`. */
export const ClaimOutcome = {
  new: "new",
  replayed: "replayed",
  inFlight: "in_flight",
  mismatch: "mismatch",
  uncertain: "uncertain",
  failed: "failed",
} as const;

interface RequestState {
  parent: Context;
  /** `traceContext: "link"`: the caller's span, linked from a new trace. */
  links?: Array<{ context: SpanContext }>;
  span?: Span;
  ctx?: Context;
  claim?: Span;
  claimStart: number;
  save?: Span;
  ended: boolean;
}

const states = new WeakMap<Claim, RequestState>();

/** What a claim that threw `err` found: its request's outcome, where it names one the claim can have. */
function claimOutcomeOf(err: unknown): string {
  switch (outcomeOfError(err)) {
    case Outcome.Uncertain:
      return ClaimOutcome.uncertain;
    case Outcome.InFlight:
      return ClaimOutcome.inFlight;
    case Outcome.Mismatch:
      return ClaimOutcome.mismatch;
    default:
      return ClaimOutcome.failed;
  }
}

function endClaim(api: OtelApi, s: RequestState, outcome: string): void {
  const span = s.claim;
  if (!span) return;
  s.claim = undefined;
  const seconds = (performance.now() - s.claimStart) / 1000;
  span.setAttribute("idem.claim.outcome", outcome);
  span.setAttribute("idem.claim.wait_duration", seconds); // seconds, as the conventions measure time
  span.end();
  instrument(api, "claim", (m) =>
    m.createHistogram("idem.claim.duration", {
      unit: "s",
      description: "Time from a keyed request's claim to its answer: the lock wait included",
    }),
  ).record(seconds, { "idem.claim.outcome": outcome });
}

function startRequest(api: OtelApi, claim: Claim, s: RequestState, mode: string): void {
  const options = s.links ? { root: true, links: s.links } : undefined;
  const span = tracer(api).startSpan("idem.request", options, s.parent);
  if (span.isRecording()) span.setAttributes({ "idem.mode": mode, ...keyAttributes(claim.scope, claim.key) });
  s.span = span;
  s.ctx = api.trace.setSpan(s.parent, span);
}

export const serverObserver: LifecycleObserver = {
  begin(claim, req, traceContext) {
    const api = otel();
    if (!api) return false;
    let parent = api.context.active();
    if (!api.trace.getSpan(parent)) {
      const traceparent = req.header("traceparent");
      if (traceparent) {
        const tracestate = req.header("tracestate");
        parent = extractFrom(api, tracestate ? { traceparent, tracestate } : { traceparent });
      }
    }
    if (traceContext !== "link") {
      states.set(claim, { parent, claimStart: 0, ended: false });
      return true;
    }
    // A trace of its own: the caller's span only linked, its baggage dropped.
    const caller = api.trace.getSpanContext(parent);
    const links = caller && api.trace.isSpanContextValid(caller) ? [{ context: caller }] : [];
    const own = api.propagation.deleteBaggage(api.trace.deleteSpan(parent));
    states.set(claim, { parent: own, links, claimStart: 0, ended: false });
    return true;
  },

  async run(claim: Claim, mode, run: () => Promise<AtomicOutcome>): Promise<AtomicOutcome> {
    const api = otel();
    const s = states.get(claim);
    if (!api || !s) return run();
    startRequest(api, claim, s, mode);
    if (mode === "atomic") {
      s.claim = tracer(api).startSpan("idem.claim", {}, s.ctx);
      s.claimStart = performance.now();
    }
    let out: AtomicOutcome;
    try {
      out = await api.context.with(s.ctx!, run);
    } catch (err) {
      endClaim(api, s, claimOutcomeOf(err));
      if (s.save) {
        failSpan(api, s.save, err);
        s.save.end();
        s.save = undefined;
      }
      if (s.span && !isIdemError(err)) failSpan(api, s.span, err);
      // The lifecycle answers most errors (then `settled` ends the span); one it rethrows ends it here.
      setTimeout(() => endRequest(s), 0).unref?.();
      throw err;
    }
    endClaim(api, s, out.kind === "replayed" ? ClaimOutcome.replayed : ClaimOutcome.new);
    if (s.save) {
      s.save.setAttribute("idem.saved", out.kind !== "replayed" && out.saved);
      s.save.end();
      s.save = undefined;
    }
    return out;
  },

  async work<T>(claim: Claim, work: () => Promise<T>): Promise<T> {
    const api = otel();
    const s = states.get(claim);
    if (!api || !s?.ctx) return work();
    endClaim(api, s, ClaimOutcome.new);
    const span = tracer(api).startSpan("idem.work", {}, s.ctx);
    const started = performance.now();
    try {
      return await api.context.with(api.trace.setSpan(s.ctx, span), work);
    } catch (err) {
      failSpan(api, span, err);
      throw err;
    } finally {
      span.end();
      instrument(api, "work", (m) =>
        m.createHistogram("idem.work.duration", {
          unit: "s",
          description: "Time the handler's work took under a claimed key",
        }),
      ).record((performance.now() - started) / 1000);
      s.save = tracer(api).startSpan("idem.save", {}, s.ctx);
    }
  },

  settled(claim: Claim, settled: Settled) {
    const api = otel();
    if (!api) return;
    const attrs = { "idem.outcome": settled.outcome };
    instrument(api, "requests", (m) =>
      m.createCounter("idem.requests", { description: "Keyed requests answered, by outcome" }),
    ).add(1, attrs);
    if (settled.outcome === Outcome.Replayed) {
      instrument(api, "replays", (m) =>
        m.createCounter("idem.replays", { description: "Saved answers replayed" }),
      ).add(1);
    } else if (settled.outcome === Outcome.InFlight) {
      instrument(api, "in_flight", (m) =>
        m.createCounter("idem.in_flight", { description: "409 answers: another request holds the key" }),
      ).add(1);
    }
    const s = states.get(claim);
    if (!s) return;
    if (!s.span) startRequest(api, claim, s, "atomic"); // refused before anything ran
    const span = s.span!;
    span.setAttribute("idem.outcome", settled.outcome);
    span.setAttribute("http.response.status_code", settled.response.status);
    if (settled.response.status >= 500) span.setStatus({ code: api.SpanStatusCode.ERROR });
    endRequest(s);
  },
};

function endRequest(s: RequestState): void {
  if (s.ended || !s.span) return;
  s.ended = true;
  s.span.end();
}

/** Install the server observer into the lifecycle (the HTTP adapters call this once when loaded). */
export function installServerTelemetry(): void {
  setLifecycleObserver(serverObserver);
}
