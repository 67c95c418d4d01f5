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
 * The store calls them through its hook (`StoreObserver` in `src/core/observe.ts`), which names the
 * spans; `storeObserver` here makes them, and writes the trace context into outbox events' headers.
 */
import { isLeaseLostError } from "../core/errors.ts";
import type { StoreObserver } from "../core/observe.ts";
import { Outcome, outcomeOfError } from "../core/outcome.ts";
import { outboxHeaders } from "./messaging.ts";
import { failSpan, instrument, otel, tracer } from "./otel.ts";

type Attributes = Record<string, string | number | boolean>;

/** Run `fn` under a span `name` (a child of the active span); `describe` adds attributes from its result. */
async function span<T>(
  name: string,
  attributes: Attributes,
  fn: () => Promise<T>,
  describe?: (result: T) => Attributes,
): Promise<T> {
  const api = otel();
  if (!api) return fn();
  const span = tracer(api).startSpan(name, { attributes });
  try {
    const result = await api.context.with(api.trace.setSpan(api.context.active(), span), fn);
    if (describe && span.isRecording()) span.setAttributes(describe(result));
    return result;
  } catch (err) {
    const failed = failedAttributes(err);
    if (failed) span.setAttributes(failed);
    failSpan(api, span, err);
    throw err;
  } finally {
    span.end();
  }
}

/** What a failure says on its span: a stale worker fenced off, a key sent to review, a key in flight. */
function failedAttributes(err: unknown): Attributes | undefined {
  if (isLeaseLostError(err)) return { "idem.phase.fenced": true };
  switch (outcomeOfError(err)) {
    case Outcome.Uncertain:
      return { "idem.needs_review": true };
    case Outcome.InFlight:
      return { "idem.claim.outcome": "in_flight" };
    default:
      return undefined;
  }
}

/** Another worker's expired lease was taken over (an event on the active span, and a count). */
function leaseTakenOver(point: string): void {
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
function sentToReview(point: string, reason: string): void {
  const api = otel();
  if (!api) return;
  api.trace
    .getSpan(api.context.active())
    ?.addEvent("idem.needs_review", { "idem.phase.name": point, "idem.review.reason": reason.slice(0, 500) });
  instrument(api, "needs_review", (m) =>
    m.createCounter("idem.phases.needs_review", { description: "Keys sent to review (outcome unknown)" }),
  ).add(1);
}

/** The store's observer: spans, events and counters through `@opentelemetry/api` when it is there. */
export const storeObserver: StoreObserver = { span, leaseTakenOver, sentToReview, outboxHeaders };
