/**
 * The messaging code's one hook for tracing and metrics: the relay's publishes and parked events, and
 * each delivery a consumer handles. It imports no telemetry library: an observer is installed from
 * outside (`src/observability/messaging.ts`, by `installTelemetry`), as the lifecycle's is
 * (`src/core/observe.ts`); with none, each call site costs one comparison.
 */
import type { Delivery, OutboxMessage, PublishOutcome } from "./types.ts";

export interface MessagingObserver {
  /**
   * Publish `messages` through `publish`, observed: `publish` may be handed copies whose headers carry
   * each event's own trace context.
   */
  publish(
    system: string,
    messages: OutboxMessage[],
    publish: (messages: OutboxMessage[]) => Promise<PublishOutcome[]>,
  ): Promise<PublishOutcome[]>;
  /** `n` events were parked by the relay (failed `maxAttempts` times). */
  parked(n: number): void;
  /** A delivery reached a consumer. */
  deliveryStarted(d: Delivery, system?: string): void;
  /** The inbox's result for a delivery: `applied`, `duplicate`, `retry`, `parked`, `dropped`; or the error. */
  deliveryEnded(d: Delivery, result: string, err?: unknown): void;
}

let installed: MessagingObserver | undefined;

/** Install (or with undefined, remove) the process's messaging observer. */
export function setMessagingObserver(observer: MessagingObserver | undefined): void {
  installed = observer;
}

/** Publish `messages`, observed when an observer is installed. */
export function tracePublish(
  system: string,
  messages: OutboxMessage[],
  publish: (messages: OutboxMessage[]) => Promise<PublishOutcome[]>,
): Promise<PublishOutcome[]> {
  return installed ? installed.publish(system, messages, publish) : publish(messages);
}

/** Count events parked by the relay. */
export function countParked(n: number): void {
  if (n > 0) installed?.parked(n);
}

/** A delivery reached the consumer. */
export function deliveryStarted(d: Delivery, system?: string): void {
  installed?.deliveryStarted(d, system);
}

/** The inbox's result for a delivery. */
export function deliveryEnded(d: Delivery, result: string, err?: unknown): void {
  installed?.deliveryEnded(d, result, err);
}
