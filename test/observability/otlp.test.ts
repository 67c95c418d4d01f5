/**
 * The exporter path end to end: idem's spans go through the SDK's BatchSpanProcessor and the OTLP/HTTP
 * exporter to a receiver this test runs on 127.0.0.1 (an ephemeral port), which decodes what arrived.
 * The scenario: idem's client retries a POST whose first answer is a 503.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { BatchSpanProcessor } from "@opentelemetry/sdk-trace";
import { afterAll, beforeAll, expect, it } from "vitest";
import { createClient } from "../../src/client/index.ts";
import { installSdk, type Sdk } from "./sdk.ts";

interface OtlpSpan {
  name: string;
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  attributes: { key: string; value: Record<string, unknown> }[];
}

let receiver: Server;
let api: Server;
let sdk: Sdk;
const received: { path: string; type: string; spans: OtlpSpan[] }[] = [];

const listen = async (s: Server) => {
  await new Promise<void>((resolve) => s.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(s.address() as AddressInfo).port}`;
};

beforeAll(async () => {
  receiver = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as {
        resourceSpans: { scopeSpans: { scope: { name: string }; spans: OtlpSpan[] }[] }[];
      };
      const spans = body.resourceSpans.flatMap((r) => r.scopeSpans.flatMap((s) => s.spans));
      received.push({ path: req.url ?? "", type: String(req.headers["content-type"]), spans });
      res.writeHead(200, { "content-type": "application/json" });
      res.end("{}");
    });
  });
  const url = await listen(receiver);
  sdk = installSdk([
    new BatchSpanProcessor({
      exporter: new OTLPTraceExporter({ url: `${url}/v1/traces` }),
      scheduledDelayMillis: 60_000,
    }),
  ]);
  let calls = 0;
  api = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      if (calls++ === 0) {
        res.writeHead(503, { "retry-after": "0" });
        res.end();
      } else {
        res.writeHead(201, { "content-type": "application/json" });
        res.end('{"ok":true}');
      }
    });
  });
  await listen(api);
});
afterAll(async () => {
  await sdk?.uninstall();
  for (const s of [api, receiver]) {
    s?.closeAllConnections();
    await new Promise<void>((resolve) => (s ? s.close(() => resolve()) : resolve()));
  }
});

it("exports the client's intent and attempt spans over OTLP/HTTP to a receiver", async () => {
  const base = `http://127.0.0.1:${(api.address() as AddressInfo).port}`;
  const client = createClient({ baseUrl: base, retry: { baseMs: 1, capMs: 5 } });
  expect((await client.post("/payments", { amount_cents: 100 })).status).toBe(201);
  await sdk.flush(); // the batch processor exports now
  expect(received.length).toBeGreaterThan(0);
  expect(received[0]!.path).toBe("/v1/traces");
  expect(received[0]!.type).toMatch(/application\/json/);
  const spans = received.flatMap((r) => r.spans);
  const intent = spans.find((s) => s.name === "idem.intent")!;
  const attempts = spans.filter((s) => s.name === "POST");
  expect(attempts).toHaveLength(2);
  expect(attempts.every((a) => a.parentSpanId === intent.spanId && a.traceId === intent.traceId)).toBe(true);
  const resend = attempts[1]!.attributes.find((a) => a.key === "http.request.resend_count");
  expect(Number(resend?.value.intValue)).toBe(1);
  const status = attempts[0]!.attributes.find((a) => a.key === "http.response.status_code");
  expect(Number(status?.value.intValue)).toBe(503);
});
