/**
 * The reference service's public routes start a new trace for each request and link the caller's
 * context instead of continuing it (issue 57): a caller on the internet cannot join the service's
 * traces, nor push its tracestate or baggage into the receipt event a payment writes to the outbox.
 * The service in phases mode, in this process, with the real OpenTelemetry SDK registered (the W3C
 * trace-context and baggage propagators), called over HTTP.
 */
import { randomUUID } from "node:crypto";
import { propagation } from "@opentelemetry/api";
import { CompositePropagator, W3CBaggagePropagator, W3CTraceContextPropagator } from "@opentelemetry/core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { backends } from "../helpers/db.ts";
import { installSdk, parentOf, type Sdk } from "../observability/sdk.ts";
import { pay, type RunningService, startService } from "./service.ts";

const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;

describe(`the service's public routes and a caller's trace context (${backend.name})`, () => {
  let sdk: Sdk;
  let svc: RunningService;
  beforeAll(async () => {
    sdk = installSdk();
    propagation.disable();
    const propagators = [new W3CTraceContextPropagator(), new W3CBaggagePropagator()];
    propagation.setGlobalPropagator(new CompositePropagator({ propagators }));
    svc = await startService(backend, { paymentsMode: "phases" });
  });
  afterAll(async () => {
    await svc?.stop();
    await sdk?.uninstall();
  });

  it("a payment starts its own trace, linked to the caller's; its receipt event carries none of the caller's", async () => {
    sdk.exporter.reset();
    const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
    const res = await pay(svc.url, {
      key: randomUUID(),
      headers: {
        traceparent: `00-${traceId}-00f067aa0ba902b7-01`,
        tracestate: "vendor=caller-secret",
        baggage: "user.id=mallory,tier=platinum",
      },
    });
    expect(res.status).toBe(201);
    const payment = (await res.json()) as { id: string };
    await sdk.flush();
    const requests = sdk.named("idem.request");
    expect(requests).toHaveLength(1);
    const request = requests[0]!;
    const own = request.spanContext().traceId;
    expect(own).not.toBe(traceId);
    expect(parentOf(request)).toBeUndefined();
    expect(request.links.map((l) => l.context.traceId)).toEqual([traceId]);
    // Every span of the request is in the new trace.
    for (const span of sdk.spans()) expect(span.spanContext().traceId).not.toBe(traceId);
    const { rows } = await svc.open.db.query<{ headers: Record<string, string> }>(
      "SELECT headers FROM idem.outbox WHERE aggregate_id = $1",
      [payment.id],
    );
    expect(rows).toHaveLength(1);
    const headers = rows[0]!.headers;
    expect(headers.traceparent).toContain(own);
    expect(JSON.stringify(headers)).not.toMatch(new RegExp(`${traceId}|caller-secret|mallory|platinum`));
    expect(headers.baggage).toBeUndefined();
  });
});
