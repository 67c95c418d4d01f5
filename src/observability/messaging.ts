/**
 * Messaging spans, and the W3C trace context carried from a request to the consumer of its events:
 *
 *   writeOutbox   writes the active trace context (`traceparent`, `tracestate`) into the event's
 *                 headers, in the row, in the request's transaction
 *   relay         one `publish <topic>` span (PRODUCER) per event, child of the context in its row,
 *                 whose own context replaces it in the headers the broker carries (AMQP headers, NATS
 *                 headers, webhook request headers); the `idem.relay.lag` histogram (row written ->
 *                 broker confirmed) and the `idem.relay.parked` counter
 *   consumer      one `process <topic>` span (CONSUMER) per delivery, child of the context it
 *                 carries, ended with the inbox's result (applied, duplicate, retry, parked); the
 *                 `idem.inbox.results` counter
 *
 * Semantic conventions for messaging: the span named `{messaging.operation.name} {destination}`,
 * `messaging.system`, `messaging.operation.name` (publish / process), `messaging.operation.type` (send /
 * process), `messaging.destination.name`, `messaging.message.id`, `error.type` when it failed. idem's
 * own attributes are under `idem.`. The relay and the consumers call them through their hook
 * (`messagingObserver`, installed into `src/messaging/observe.ts`); `writeOutbox` through the store's.
 */
import type { MessagingObserver } from "../messaging/observe.ts";
import type { Delivery, OutboxMessage, PublishOutcome } from "../messaging/types.ts";
import { baggageInEvents } from "./keys.ts";
import {
  type Context,
  extractFrom,
  failSpan,
  instrument,
  type OtelApi,
  otel,
  type Span,
  tracer,
} from "./otel.ts";

const TRACE_HEADERS = ["traceparent", "tracestate"];

/**
 * The event's headers with the active trace context added (unchanged when there is none): its
 * `traceparent` and `tracestate`, never its baggage unless `baggageInEvents` is configured.
 */
export function outboxHeaders(
  headers: Record<string, string> | undefined,
): Record<string, string> | undefined {
  const api = otel();
  if (!api) return headers;
  const span = api.trace.getSpan(api.context.active());
  if (!span?.spanContext().traceId || !api.trace.isSpanContextValid(span.spanContext())) return headers;
  const out: Record<string, string> = { ...headers };
  api.propagation.inject(contextToCarry(api, api.context.active()), out);
  return out;
}

/** The context whose propagation fields an event carries: without its baggage, unless allowed. */
function contextToCarry(api: OtelApi, ctx: Context): Context {
  return baggageInEvents() ? ctx : api.propagation.deleteBaggage(ctx);
}

function hasTraceContext(headers: Record<string, string>): boolean {
  return headers.traceparent !== undefined;
}

/**
 * Publish `messages` under one span per event. `publish` gets copies whose trace context is the
 * event's publish span, so the consumer continues from it.
 */
async function tracePublish(
  system: string,
  messages: OutboxMessage[],
  publish: (messages: OutboxMessage[]) => Promise<PublishOutcome[]>,
): Promise<PublishOutcome[]> {
  const api = otel();
  if (!api) return publish(messages);
  const t = tracer(api);
  const spans: Span[] = [];
  const sent = messages.map((m) => {
    const parent = extractFrom(api, hasTraceContext(m.headers) ? m.headers : undefined);
    const span = t.startSpan(
      `publish ${m.topic}`,
      {
        kind: api.SpanKind.PRODUCER,
        attributes: {
          "messaging.system": system,
          "messaging.operation.name": "publish",
          "messaging.operation.type": "send",
          "messaging.destination.name": m.topic,
          "messaging.message.id": m.id,
          "idem.event.type": m.type,
          "idem.relay.attempt": m.attempts + 1,
        },
      },
      parent,
    );
    spans.push(span);
    if (!span.isRecording()) return m;
    const headers = { ...m.headers };
    for (const h of TRACE_HEADERS) delete headers[h];
    api.propagation.inject(contextToCarry(api, api.trace.setSpan(parent, span)), headers);
    return { ...m, headers };
  });
  let outcomes: PublishOutcome[] | undefined;
  try {
    outcomes = await publish(sent);
    return outcomes;
  } catch (err) {
    for (const span of spans) failed(api, span, err);
    throw err;
  } finally {
    const lag = instrument(api, "relay.lag", (m) =>
      m.createHistogram("idem.relay.lag", {
        unit: "s",
        description: "Time from an event's outbox row to the broker's confirmation",
      }),
    );
    const now = Date.now();
    spans.forEach((span, i) => {
      const o = outcomes?.[i];
      if (o?.ok) {
        if (o.duplicate) span.setAttribute("idem.relay.duplicate", true);
        lag.record(Math.max(0, now - messages[i]!.createdAt.getTime()) / 1000, {
          "messaging.system": system,
        });
      } else if (o) failed(api, span, o.error);
      span.end();
    });
  }
}

/** Count events parked by the relay (failed `maxAttempts` times). */
function countParked(n: number): void {
  const api = otel();
  if (!api || n === 0) return;
  instrument(api, "relay.parked", (m) =>
    m.createCounter("idem.relay.parked", {
      description: "Outbox events parked after their last failed publish",
    }),
  ).add(n);
}

const deliveries = new WeakMap<Delivery, Span>();

/** A delivery reached the consumer: start its `process <topic>` span, continuing its producer's trace. */
function deliveryStarted(d: Delivery, system?: string): void {
  const api = otel();
  if (!api) return;
  const parent = extractFrom(api, hasTraceContext(d.headers) ? d.headers : undefined);
  const span = tracer(api).startSpan(
    `process ${d.topic}`,
    {
      kind: api.SpanKind.CONSUMER,
      attributes: {
        ...(system && { "messaging.system": system }),
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": d.topic,
        "messaging.message.id": d.id,
        "idem.event.type": d.type,
        "idem.redelivered": d.redelivered,
      },
    },
    parent,
  );
  deliveries.set(d, span);
}

/** The inbox's result for a delivery: `applied`, `duplicate`, `retry` or `parked`; or the error. */
function deliveryEnded(d: Delivery, result: string, err?: unknown): void {
  const api = otel();
  if (!api) return;
  const span = deliveries.get(d);
  deliveries.delete(d);
  recordResult(api, result);
  if (!span) return;
  span.setAttribute("idem.inbox.result", result);
  if (err !== undefined) failed(api, span, err);
  span.end();
}

/** A failed messaging operation: the error recorded, and `error.type` (its class: low cardinality). */
function failed(api: OtelApi, span: Span, err: unknown): void {
  span.setAttribute("error.type", err instanceof Error ? err.name : "_OTHER");
  failSpan(api, span, err);
}

function recordResult(api: OtelApi, result: string): void {
  instrument(api, "inbox.results", (m) =>
    m.createCounter("idem.inbox.results", {
      description: "Deliveries handled by the inbox, by result (duplicate: skipped, already applied)",
    }),
  ).add(1, { "idem.inbox.result": result });
}

/** The relay's and the consumers' observer: spans and metrics through `@opentelemetry/api`. */
export const messagingObserver: MessagingObserver = {
  publish: tracePublish,
  parked: countParked,
  deliveryStarted,
  deliveryEnded,
};
