/**
 * The client's one hook for tracing: an observer sees each call (its events, and the headers of each
 * attempt). The client imports no telemetry library: an observer is installed from outside
 * (`src/observability/client.ts`, by `installTelemetry`), as the lifecycle's is (`src/core/observe.ts`);
 * with none, a call costs one comparison.
 */
import type { CircuitBreaker } from "./breaker.ts";
import type { RetryBudget } from "./budget.ts";
import type { ClientHooks } from "./events.ts";

/** What an observer reads of a call. */
export interface ObservedCall {
  method: string;
  url: string;
  key: string | undefined;
  intentId: string | undefined;
  headers: Record<string, string>;
}

/** One call, observed. */
export interface ObservedIntent {
  /** The hooks its events go to: the user's, also feeding the observer. */
  readonly hooks: ClientHooks;
  /** Attempt `n` (1-based) starts: the headers to send it with (the call's, and what the observer adds). */
  attempt(n: number, call: ObservedCall): Record<string, string>;
}

export interface ClientObserver {
  /** A call starts: observe it, or undefined to leave it alone. */
  intent(
    call: ObservedCall,
    user: ClientHooks,
    breaker: CircuitBreaker | undefined,
    budget: RetryBudget | undefined,
  ): ObservedIntent | undefined;
}

let installed: ClientObserver | undefined;
const intents = new WeakMap<object, ObservedIntent>();

/** Install (or with undefined, remove) the process's client observer. */
export function setClientObserver(observer: ClientObserver | undefined): void {
  installed = observer;
}

/** Start observing `call` (undefined when no observer is installed, or it passes). */
export function observeIntent(
  call: ObservedCall,
  user: ClientHooks,
  breaker: CircuitBreaker | undefined,
  budget: RetryBudget | undefined,
): ObservedIntent | undefined {
  const intent = installed?.intent(call, user, breaker, budget);
  if (intent) intents.set(call, intent);
  return intent;
}

/** The hooks to emit `call`'s events to: the observed ones when it is observed, else the user's. */
export function hooksOf(call: object, user: ClientHooks): ClientHooks {
  return intents.get(call)?.hooks ?? user;
}
