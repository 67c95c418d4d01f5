/**
 * idem's one door to OpenTelemetry. `@opentelemetry/api` is an optional peer: it is looked up once,
 * the first time idem has something to report, with Node's `require` (found through
 * `process.getBuiltinModule`, so nothing is imported statically and a browser bundle never pulls it
 * in). When it is not installed, or outside Node, every helper here answers `undefined` and the
 * callers skip their telemetry in one comparison.
 *
 * idem registers nothing: spans go to the global tracer provider and metrics to the global meter
 * provider that the application registers (its SDK), so they appear inside the application's own
 * request traces. The API's global state is shared between its ESM and CommonJS builds.
 */
import type * as Api from "@opentelemetry/api";

export type OtelApi = typeof Api;
export type Span = Api.Span;
export type SpanContext = Api.SpanContext;
export type Context = Api.Context;
export type Attributes = Api.Attributes;

/** The instrumentation scope's name and version: what a backend shows as the spans' library. */
export const SCOPE_NAME = "idem";
export const SCOPE_VERSION = "0.1.0";

type NodeProcess = { getBuiltinModule?: (id: string) => unknown };
type RequireFn = (id: string) => unknown;

let loaded: OtelApi | null | undefined;

function load(): OtelApi | null {
  try {
    const proc = (globalThis as { process?: NodeProcess }).process;
    const mod = proc?.getBuiltinModule?.("node:module") as
      | { createRequire(url: string): RequireFn }
      | undefined;
    if (!mod) return null;
    return mod.createRequire(import.meta.url)("@opentelemetry/api") as OtelApi;
  } catch {
    return null; // not installed: no telemetry, nothing else changes
  }
}

/** The OpenTelemetry API when it is installed, whatever is registered. */
export function loadedOtel(): OtelApi | undefined {
  if (loaded === undefined) loaded = load();
  return loaded ?? undefined;
}

let noop: { tracerProvider: unknown; meter: abstract new () => unknown } | undefined;
let meterSeen: { provider: unknown; on: boolean } | undefined;

/**
 * The OpenTelemetry API when it is installed AND the application registered a tracer or a meter
 * provider, else undefined: with nothing registered every span and metric would be dropped, so idem
 * skips them (one method call and two comparisons per call site).
 */
export function otel(): OtelApi | undefined {
  const api = loaded === undefined ? loadedOtel() : loaded;
  if (!api) return undefined;
  noop ??= {
    tracerProvider: new api.ProxyTracerProvider().getDelegate(),
    meter: api.createNoopMeter().constructor as abstract new () => unknown,
  };
  const tp = api.trace.getTracerProvider() as { getDelegate?(): unknown };
  if (tp.getDelegate?.() !== noop.tracerProvider) return api;
  const mp = api.metrics.getMeterProvider();
  if (meterSeen?.provider !== mp) {
    meterSeen = { provider: mp, on: !(mp.getMeter(SCOPE_NAME) instanceof noop.meter) };
  }
  return meterSeen.on ? api : undefined;
}

/** For tests: act as if the API were absent (`null`), or look it up again (`undefined`). */
export function setOtelForTesting(api: OtelApi | null | undefined): void {
  loaded = api;
}

let tracerOf: { provider: unknown; tracer: Api.Tracer } | undefined;

/**
 * idem's tracer from the global provider. The provider is compared on every call (one property read)
 * so that an application (or a test) that registers or replaces its provider later is followed.
 */
export function tracer(api: OtelApi): Api.Tracer {
  const provider = api.trace.getTracerProvider();
  if (tracerOf?.provider !== provider) {
    tracerOf = { provider, tracer: provider.getTracer(SCOPE_NAME, SCOPE_VERSION) };
  }
  return tracerOf.tracer;
}

let meterOf: { provider: unknown; meter: Api.Meter; instruments: Map<string, unknown> } | undefined;

/**
 * One instrument of idem's meter, made once per meter provider (the metrics API has no proxy: a meter
 * taken before the application registers its provider would stay a no-op forever).
 */
export function instrument<T>(api: OtelApi, name: string, make: (meter: Api.Meter) => T): T {
  const provider = api.metrics.getMeterProvider();
  if (meterOf?.provider !== provider) {
    meterOf = { provider, meter: provider.getMeter(SCOPE_NAME, SCOPE_VERSION), instruments: new Map() };
  }
  let made = meterOf.instruments.get(name) as T | undefined;
  if (made === undefined) {
    made = make(meterOf.meter);
    meterOf.instruments.set(name, made);
  }
  return made;
}

/** End `span` with an error status and the exception recorded (never throws). */
export function failSpan(api: OtelApi, span: Span, err: unknown): void {
  try {
    if (err instanceof Error) span.recordException(err);
    span.setStatus({
      code: api.SpanStatusCode.ERROR,
      message: err instanceof Error ? err.message : String(err),
    });
  } catch {
    // observing must never change the outcome
  }
}

/** Read a W3C trace context (`traceparent`, `tracestate`) from headers. */
export function extractFrom(api: OtelApi, headers: Record<string, string> | undefined): Context {
  const base = api.context.active();
  if (!headers) return base;
  return api.propagation.extract(base, headers);
}
