/**
 * Spans of phases mode and of the maintenance jobs, each started as a child of the active span (the
 * `idem.request` span of the request that drives the phases, or the caller's span for a job):
 *
 *   idem.phases.claim   taking the key: `idem.claim.outcome` new / takeover / replayed / in_flight...
 *   idem.phase          one phase run: `idem.phase.name`, `idem.phase.kind` (external / local);
 *                       a fencing refusal (a stale worker stopped by the token) sets `idem.phase.fenced`
 *   idem.phase.lookup   the provider lookup of a phase that may have called before
 *   idem.complete       one run of the completer (`complete()`, `idem complete`): keys found / resumed
 *   idem.sweep          dropping expired partitions: `idem.sweep.partitions_dropped`
 *
 * Events on the active span: `idem.lease_takeover` (another worker's expired lease taken over) and
 * `idem.needs_review` (with its reason). Counters: `idem.phases.takeovers`, `idem.phases.needs_review`.
 */
import { failSpan, instrument, otel, tracer } from "./otel.ts";

/** Run `fn` under a span `name` (a child of the active span); `describe` adds attributes from its result. */
export async function traced<T>(
  name: string,
  attributes: Record<string, string | number | boolean>,
  fn: () => Promise<T>,
  describe?: (result: T) => Record<string, string | number | boolean>,
): Promise<T> {
  const api = otel();
  if (!api) return fn();
  const span = tracer(api).startSpan(name, { attributes });
  try {
    const result = await api.context.with(api.trace.setSpan(api.context.active(), span), fn);
    if (describe && span.isRecording()) span.setAttributes(describe(result));
    return result;
  } catch (err) {
    const name = (err as Error | undefined)?.name;
    if (name === "LeaseLostError") span.setAttribute("idem.phase.fenced", true);
    else if (name === "OperationUncertainError") span.setAttribute("idem.needs_review", true);
    else if (name === "KeyInFlightError") span.setAttribute("idem.claim.outcome", "in_flight");
    failSpan(api, span, err);
    throw err;
  } finally {
    span.end();
  }
}

/** Taking a phases key: `idem.phases.claim`, with what was found (`claimed`, or the key's answer). */
export function traceClaim<T extends object>(fn: () => Promise<T>): Promise<T> {
  return traced("idem.phases.claim", {}, fn, (g) => ({
    "idem.claim.outcome": "kind" in g ? String(g.kind) : "claimed",
  }));
}

/** One phase run: `idem.phase`. */
export function tracePhase<T>(point: string, external: boolean, fn: () => Promise<T>): Promise<T> {
  const kind = external ? "external" : "local";
  return traced("idem.phase", { "idem.phase.name": point, "idem.phase.kind": kind }, fn);
}

/** A provider lookup: `idem.phase.lookup`, with `idem.lookup.found`. */
export function traceLookup<T>(point: string, fn: () => Promise<T>): Promise<T> {
  return traced("idem.phase.lookup", { "idem.phase.name": point }, fn, (f) => ({
    "idem.lookup.found": f !== undefined && f !== null,
  }));
}

/** Another worker's expired lease was taken over (an event on the active span, and a count). */
export function leaseTakenOver(point: string): void {
  const api = otel();
  if (!api) return;
  api.trace.getSpan(api.context.active())?.addEvent("idem.lease_takeover", { "idem.phase.name": point });
  instrument(api, "takeovers", (m) =>
    m.createCounter("idem.phases.takeovers", {
      description: "Expired leases taken over from another worker",
    }),
  ).add(1);
}

/** A key was sent to review (an event on the active span, and a count). */
export function sentToReview(point: string, reason: string): void {
  const api = otel();
  if (!api) return;
  api.trace
    .getSpan(api.context.active())
    ?.addEvent("idem.needs_review", { "idem.phase.name": point, "idem.review.reason": reason.slice(0, 500) });
  instrument(api, "needs_review", (m) =>
    m.createCounter("idem.phases.needs_review", { description: "Keys sent to review (outcome unknown)" }),
  ).add(1);
}
