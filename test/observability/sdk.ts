/**
 * The real OpenTelemetry SDK, registered globally as an application would: an AsyncLocalStorage
 * context manager, the W3C trace-context propagator, a tracer provider whose spans land in an
 * in-memory exporter, and a meter provider read on demand. `uninstall()` puts the globals back. Like
 * an application's telemetry setup, it loads `idem/observability`, which installs idem's observers
 * into the client, the store and the relay (an HTTP adapter alone installs them too).
 */
import { context, metrics, propagation, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import {
  type DataPoint,
  MeterProvider,
  MetricReader,
  type ResourceMetrics,
} from "@opentelemetry/sdk-metrics";
import "../../src/observability/index.ts";
import {
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
  type SpanProcessor,
  TracerProvider,
} from "@opentelemetry/sdk-trace";

class PullReader extends MetricReader {
  protected async onForceFlush(): Promise<void> {}
  protected async onShutdown(): Promise<void> {}
}

export interface Sdk {
  exporter: InMemorySpanExporter;
  /** Wait for ended spans to reach the exporter (the SDK exports asynchronously). */
  flush(): Promise<void>;
  spans(): ReadableSpan[];
  /** The spans named `name`. */
  named(name: string): ReadableSpan[];
  /** The metric's data points (after a collection). */
  points(name: string): Promise<DataPoint<unknown>[]>;
  uninstall(): Promise<void>;
}

export function installSdk(processors: SpanProcessor[] = []): Sdk {
  const exporter = new InMemorySpanExporter();
  const provider = new TracerProvider({
    spanProcessors: [new SimpleSpanProcessor({ exporter }), ...processors],
  });
  const contextManager = new AsyncLocalStorageContextManager().enable();
  context.setGlobalContextManager(contextManager);
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  trace.setGlobalTracerProvider(provider);
  const reader = new PullReader();
  const meters = new MeterProvider({ readers: [reader] });
  metrics.setGlobalMeterProvider(meters);
  return {
    exporter,
    flush: () => provider.forceFlush(),
    spans: () => exporter.getFinishedSpans(),
    named: (name) => exporter.getFinishedSpans().filter((s) => s.name === name),
    async points(name) {
      const { resourceMetrics } = (await reader.collect()) as { resourceMetrics: ResourceMetrics };
      for (const scope of resourceMetrics.scopeMetrics) {
        for (const m of scope.metrics)
          if (m.descriptor.name === name) return m.dataPoints as DataPoint<unknown>[];
      }
      return [];
    },
    async uninstall() {
      await provider.shutdown();
      await meters.shutdown();
      trace.disable();
      metrics.disable();
      propagation.disable();
      context.disable();
    },
  };
}

/** The parent span id of a span (SDK 2+ keeps it in `parentSpanContext`). */
export function parentOf(span: ReadableSpan): string | undefined {
  return span.parentSpanContext?.spanId;
}

/** The span tree as "name [attr]" lines, children indented, in start order. */
export function tree(spans: readonly ReadableSpan[], label: (s: ReadableSpan) => string): string[] {
  const lines: string[] = [];
  const ids = new Set(spans.map((s) => s.spanContext().spanId));
  const walk = (parent: string | undefined, depth: number) => {
    const kids = spans
      .filter((s) => (parent === undefined ? !ids.has(parentOf(s) ?? "") : parentOf(s) === parent))
      .sort((a, b) => a.startTime[0] - b.startTime[0] || a.startTime[1] - b.startTime[1]);
    for (const k of kids) {
      lines.push(`${"  ".repeat(depth)}${label(k)}`);
      walk(k.spanContext().spanId, depth + 1);
    }
  };
  walk(undefined, 0);
  return lines;
}
