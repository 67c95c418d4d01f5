/**
 * The hooks for tracing and metrics of the lifecycle and of the store. The core imports no telemetry
 * library: observers are installed from outside (`installTelemetry` in `src/observability/install.ts`,
 * run when `idem/observability`, an HTTP adapter or the `idem` command loads), and the lifecycle and
 * the store only tell them where a keyed request stands. With none installed, or nothing recording,
 * each call site costs one comparison. The client and the messaging code have hooks of their own
 * (`src/client/observe.ts`, `src/messaging/observe.ts`): no folder imports `src/observability`.
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
   * Run `run` (the claim, the work and the saved answer, or a phases runner) inside the request's span.
   * `mode` says which: in atomic mode `work` marks where the claim ended and the saved answer begins.
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

/** Span and event attributes. */
type Attributes = Record<string, string | number | boolean>;

/**
 * The store's one hook for tracing and metrics: phases mode (the claim, each phase, a provider lookup,
 * a lease taken over, a key sent to review), the maintenance jobs (sweep, completer) and the outbox's
 * writes (the trace context an event carries). Installed from outside, as the lifecycle's observer is
 * (`src/observability/phases.ts`); with none, each call site runs its work as it is.
 */
export interface StoreObserver {
  /** Run `fn` under a span `name`, a child of the active span; `describe` adds attributes from its result. */
  span<T>(
    name: string,
    attributes: Attributes,
    fn: () => Promise<T>,
    describe?: (result: T) => Attributes,
  ): Promise<T>;
  /** Another worker's expired lease on a key at `point` was taken over. */
  leaseTakenOver(point: string): void;
  /** A key at `point` was sent to review, for `reason`. */
  sentToReview(point: string, reason: string): void;
  /** An outbox event's headers with the active trace context added (unchanged when there is none). */
  outboxHeaders(headers: Record<string, string> | undefined): Record<string, string> | undefined;
}

let store: StoreObserver | undefined;

/** Install (or with undefined, remove) the process's store observer. */
export function setStoreObserver(observer: StoreObserver | undefined): void {
  store = observer;
}

/** Run `fn` under a span `name` (a child of the active span); `describe` adds attributes from its result. */
export function traced<T>(
  name: string,
  attributes: Attributes,
  fn: () => Promise<T>,
  describe?: (result: T) => Attributes,
): Promise<T> {
  return store ? store.span(name, attributes, fn, describe) : fn();
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

/** Another worker's expired lease was taken over. */
export function leaseTakenOver(point: string): void {
  store?.leaseTakenOver(point);
}

/** A key was sent to review. */
export function sentToReview(point: string, reason: string): void {
  store?.sentToReview(point, reason);
}

/** The event's headers with the active trace context added (unchanged when there is none). */
export function outboxHeaders(
  headers: Record<string, string> | undefined,
): Record<string, string> | undefined {
  return store ? store.outboxHeaders(headers) : headers;
}
