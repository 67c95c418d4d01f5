/**
 * The lifecycle's one hook for tracing and metrics. The core imports no telemetry library: an observer
 * is installed from outside (`src/observability/server.ts` installs one when `@opentelemetry/api` is
 * there, through the HTTP adapters), and the lifecycle only tells it where a keyed request stands.
 * With none installed, or nothing recording, each call site costs one comparison.
 */
import type { TraceContextMode } from "./lifecycle-options.ts";
import type { Settled } from "./outcome.ts";
import type { AtomicOutcome, Claim } from "./store.ts";

export interface LifecycleObserver {
  /**
   * A keyed request was read (before its claim): remember where its trace comes from (`traceContext`:
   * the route's choice, continue the caller's trace or link to it). True when the request is observed;
   * when false, its `run` and `work` are not called (they would add nothing).
   */
  begin(
    claim: Claim,
    req: { header(name: string): string | null | undefined },
    traceContext?: TraceContextMode,
  ): boolean;
  /**
   * Run `run` (the claim, the work and the saved reply, or a phases runner) inside the request's span.
   * `mode` says which: in atomic mode `work` marks where the claim ended and the saved reply begins.
   */
  run(claim: Claim, mode: "atomic" | "phases", run: () => Promise<AtomicOutcome>): Promise<AtomicOutcome>;
  /** Atomic mode: the handler's work, called once the key is claimed. */
  work<T>(claim: Claim, work: () => Promise<T>): Promise<T>;
  /** How the request ended (every keyed answer passes here once). */
  settled(claim: Claim, settled: Settled): void;
}

let installed: LifecycleObserver | undefined;

/** Install (or with undefined, remove) the process's lifecycle observer. */
export function setLifecycleObserver(observer: LifecycleObserver | undefined): void {
  installed = observer;
}

export function lifecycleObserver(): LifecycleObserver | undefined {
  return installed;
}
