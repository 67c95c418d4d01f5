/**
 * The client's spans with the real SDK, against a real idem server on 127.0.0.1 (PostgreSQL, PGlite without DATABASE_URL) whose first
 * reply is lost: one idem.intent span, two attempt spans (the second with http.request.resend_count 1
 * and the first's retry reason on the intent), and under each attempt the server's spans, joined
 * through the traceparent header the client sends: claim (new) -> work -> save, then claim (replayed).
 */
import { SpanKind } from "@opentelemetry/api";
import type { ReadableSpan } from "@opentelemetry/sdk-trace";
import { afterAll, beforeAll, expect, it } from "vitest";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { backends, serverBackends } from "../helpers/db.ts";
import { type PaymentApi, pay, startPaymentApi } from "./payment.ts";
import { installSdk, type Sdk, tree } from "./sdk.ts";

let sdk: Sdk;
let api: PaymentApi;
let closeDb: () => Promise<void>;

beforeAll(async () => {
  sdk = installSdk();
  const open = await (serverBackends[0] ?? backends[0]!).open();
  const db = open.db;
  await migrate(db);
  api = await startPaymentApi(db, "receipts");
  closeDb = () => open.close();
});
afterAll(async () => {
  await api?.close();
  await closeDb?.();
  await sdk?.uninstall();
});

it("traces a retried payment: intent -> 2 attempts -> claim (new), work, save; then claim (replayed)", async () => {
  const response = await pay(api);
  expect(response.status).toBe(201);
  expect(response.headers.get("idempotent-replayed")).toBe("true");
  await sdk.flush();
  const spans = sdk.spans();
  const label = (s: ReadableSpan) => {
    const a = s.attributes;
    const extra = a["idem.claim.outcome"] ?? a["http.request.resend_count"] ?? a["idem.outcome"];
    return extra === undefined ? s.name : `${s.name} [${extra}]`;
  };
  expect(tree(spans, label)).toEqual([
    "idem.intent",
    "  POST",
    "    idem.request [executed]",
    "      idem.claim [new]",
    "      idem.work",
    "      idem.save",
    "  POST [1]",
    "    idem.request [replayed]",
    "      idem.claim [replayed]",
  ]);
  expect(new Set(spans.map((s) => s.spanContext().traceId)).size).toBe(1);
  const [intent] = sdk.named("idem.intent");
  expect(intent!.attributes["idem.client.attempts"]).toBe(2);
  expect(intent!.events.map((e) => [e.name, e.attributes?.["idem.retry.reason"]])).toEqual([
    ["idem.retry", "lost-reply"],
  ]);
  const attempts = sdk.named("POST");
  expect(attempts[0]!.attributes["error.type"]).toBe("lost-reply");
  expect(attempts[1]!.attributes["http.response.status_code"]).toBe(201);
  // The stable HTTP client conventions: named by the method, kind CLIENT, where the request went.
  const where = new URL(api.url);
  for (const a of attempts) {
    expect(a.kind).toBe(SpanKind.CLIENT);
    expect(a.attributes).toMatchObject({
      "http.request.method": "POST",
      "server.address": where.hostname,
      "server.port": Number(where.port),
      "url.full": expect.stringMatching(/^http:\/\/127\.0\.0\.1:\d+\//),
    });
  }
  expect(intent!.kind).toBe(SpanKind.INTERNAL); // the logical operation; its attempts are the CLIENT spans
  // Waits in seconds, and idem's own attributes under idem. only.
  expect(typeof intent!.events[0]!.attributes?.["idem.retry.delay"]).toBe("number");
  for (const span of spans) {
    for (const name of Object.keys(span.attributes)) {
      expect(name).toMatch(/^(idem|http|error|url|server)\./);
    }
  }
  const perIntent = await sdk.points("idem.client.attempts");
  expect(perIntent[0]?.value).toMatchObject({ count: 1, sum: 2 });
});
