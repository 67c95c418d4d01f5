/**
 * The server's spans and metrics with the real OpenTelemetry SDK, through the Hono adapter on PostgreSQL (PGlite without DATABASE_URL):
 * a new key (claim new -> work -> save), its replay (claim replayed), a mismatch, a request that joins
 * the caller's trace through its `traceparent` header, and keys exported hashed, never as sent.
 */
import { context, propagation, trace } from "@opentelemetry/api";
import { CompositePropagator, W3CBaggagePropagator, W3CTraceContextPropagator } from "@opentelemetry/core";
import { Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type IdempotencyEnv, idempotency } from "../../src/http/hono.ts";
import { configureTelemetry } from "../../src/observability/keys.ts";
import { setOtelForTesting } from "../../src/observability/otel.ts";
import type { Db } from "../../src/postgres/db.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { backends, serverBackends } from "../helpers/db.ts";
import { installSdk, parentOf, type Sdk } from "./sdk.ts";

/** The SDK's default propagators: W3C trace context and W3C baggage (the global one replaced). */
function withBaggagePropagator(): void {
  propagation.disable();
  const propagators = [new W3CTraceContextPropagator(), new W3CBaggagePropagator()];
  expect(propagation.setGlobalPropagator(new CompositePropagator({ propagators }))).toBe(true);
}

describe("server spans and metrics (real SDK)", () => {
  let sdk: Sdk;
  let app: Hono;
  let close: () => Promise<void>;
  let release: () => void = () => {};
  let eventHeaders: (id: string) => Promise<Record<string, string>>;
  let db: Db;

  beforeAll(async () => {
    sdk = installSdk();
    const open = await (serverBackends[0] ?? backends[0]!).open();
    db = open.db;
    await migrate(db);
    await db.exec("CREATE TABLE notes (id serial PRIMARY KEY, body text NOT NULL)");
    const store = await PostgresStore.open(db);
    app = new Hono();
    app.post(
      "/notes",
      idempotency({ store, scope: (c) => c.req.header("x-account") }),
      async (c: import("hono").Context<IdempotencyEnv>) => {
        const { tx } = c.var.idempotency;
        const { rows } = await tx.query<{ id: number }>("INSERT INTO notes (body) VALUES ('x') RETURNING id");
        return c.json({ id: rows[0]!.id }, 201);
      },
    );
    // A route whose handler waits until the test releases it, behind a store with a short duplicate wait.
    const quick = await PostgresStore.open(db, { lockTimeoutMs: 300 });
    app.post("/slow", idempotency({ store: quick, scope: (c) => c.req.header("x-account") }), async (c) => {
      await new Promise<void>((resolve) => {
        release = resolve;
      });
      return c.json({ ok: true }, 201);
    });
    // A public route: a trace of its own per request; its work writes an event to the outbox.
    app.post(
      "/public",
      idempotency({ store, scope: (c) => c.req.header("x-account"), traceContext: "link" }),
      async (c: import("hono").Context<IdempotencyEnv>) => {
        const id = await writeOutbox(c.var.idempotency.tx, { topic: "t", type: "note.made", payload: {} });
        return c.json({ id }, 201);
      },
    );
    eventHeaders = async (id) =>
      (await db.query<{ headers: unknown }>("SELECT headers FROM idem.outbox WHERE id = $1", [id])).rows[0]!
        .headers as Record<string, string>;
    close = () => open.close();
  });
  afterAll(async () => {
    await sdk?.uninstall();
    await close?.();
  });

  const post = (key: string, body: string, headers: Record<string, string> = {}) =>
    app.request("/notes", {
      method: "POST",
      headers: {
        "idempotency-key": key,
        "x-account": "acct_secret_1",
        "content-type": "application/json",
        ...headers,
      },
      body,
    });

  it("traces a new key as claim (new) -> work -> save, and its replay as claim (replayed)", async () => {
    sdk.exporter.reset();
    expect((await post("key-new-1", '{"a":1}')).status).toBe(201);
    expect((await post("key-new-1", '{"a":1}')).status).toBe(201);
    await sdk.flush();
    const requests = sdk.named("idem.request");
    expect(requests.map((s) => s.attributes["idem.outcome"])).toEqual(["executed", "replayed"]);
    const [first, second] = requests;
    const children = (parent: typeof first) =>
      sdk
        .spans()
        .filter((s) => parentOf(s) === parent!.spanContext().spanId)
        .map((s) => s.name);
    expect(children(first)).toEqual(["idem.claim", "idem.work", "idem.save"]);
    expect(children(second)).toEqual(["idem.claim"]);
    const claims = sdk.named("idem.claim");
    expect(claims.map((s) => s.attributes["idem.claim.outcome"])).toEqual(["new", "replayed"]);
    // The lock wait in seconds (the conventions' unit for durations), well under the request's time.
    const wait = claims[0]!.attributes["idem.claim.wait_duration"] as number;
    expect(typeof wait).toBe("number");
    expect(wait).toBeGreaterThanOrEqual(0);
    expect(wait).toBeLessThan(10);
    // No attribute outside the conventions' namespaces and idem's one.
    for (const span of sdk.spans()) {
      for (const name of Object.keys(span.attributes))
        expect(name).toMatch(/^(idem|http|error|url|server)\./);
    }
    expect(sdk.named("idem.save")[0]!.attributes["idem.saved"]).toBe(true);
    expect(first!.attributes["http.response.status_code"]).toBe(201);
  });

  it("exports the scope and key hashed by default, as a prefix when configured, never as sent", async () => {
    sdk.exporter.reset();
    await post("key-secret-42", "{}");
    configureTelemetry({ keys: { prefix: 4 } });
    await post("key-secret-43", "{}");
    configureTelemetry({ keys: "hash" });
    await sdk.flush();
    const [hashed, prefixed] = sdk.named("idem.request");
    expect(hashed!.attributes["idem.key"]).toMatch(/^[0-9a-f]{16}$/);
    expect(hashed!.attributes["idem.scope"]).toMatch(/^[0-9a-f]{16}$/);
    expect(prefixed!.attributes["idem.key"]).toBe("key-");
    const everything = JSON.stringify(sdk.spans().map((s) => s.attributes));
    expect(everything).not.toContain("key-secret-42");
    expect(everything).not.toContain("acct_secret_1");
  });

  it("marks a reused key with another body as claim (mismatch) and counts outcomes", async () => {
    sdk.exporter.reset();
    await post("key-mm", '{"a":1}');
    expect((await post("key-mm", '{"a":2}')).status).toBe(422);
    await sdk.flush();
    expect(sdk.named("idem.claim").map((s) => s.attributes["idem.claim.outcome"])).toEqual([
      "new",
      "mismatch",
    ]);
    const points = await sdk.points("idem.requests");
    const count = (outcome: string) =>
      points.filter((p) => p.attributes["idem.outcome"] === outcome).reduce((n, p) => n + Number(p.value), 0);
    expect(count("mismatch")).toBe(1);
    expect(count("replayed")).toBe(1);
    expect(count("executed")).toBeGreaterThanOrEqual(4);
    expect((await sdk.points("idem.replays"))[0]?.value).toBe(1);
    const waits = await sdk.points("idem.claim.duration");
    expect(waits.length).toBeGreaterThan(0);
    expect((await sdk.points("idem.work.duration")).length).toBe(1);
  });

  it("continues the caller's trace from its traceparent header", async () => {
    sdk.exporter.reset();
    const traceId = "0af7651916cd43dd8448eb211c80319c";
    await post("key-tp", "{}", { traceparent: `00-${traceId}-b7ad6b7169203331-01` });
    await sdk.flush();
    const [request] = sdk.named("idem.request");
    expect(request!.spanContext().traceId).toBe(traceId);
    expect(parentOf(request!)).toBe("b7ad6b7169203331");
  });

  it("a route with traceContext link starts a trace of its own, linked to the caller's; its event carries neither", async () => {
    sdk.exporter.reset();
    withBaggagePropagator();
    try {
      const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
      const caller = {
        traceparent: `00-${traceId}-00f067aa0ba902b7-01`,
        tracestate: "vendor=caller-secret",
        baggage: "user.id=alice,plan=gold",
      };
      // As an application's HTTP instrumentation would: the caller's context (its span, its baggage)
      // active while the route runs.
      const res = await context.with(propagation.extract(context.active(), caller), () =>
        app.request("/public", {
          method: "POST",
          headers: { "idempotency-key": "key-public-1", "x-account": "acct_1", ...caller },
          body: "{}",
        }),
      );
      expect(res.status).toBe(201);
      const { id } = (await res.json()) as { id: string };
      await sdk.flush();
      const [request] = sdk.named("idem.request");
      expect(request!.spanContext().traceId).not.toBe(traceId); // a new trace
      expect(parentOf(request!)).toBeUndefined();
      expect(request!.links.map((l) => [l.context.traceId, l.context.spanId])).toEqual([
        [traceId, "00f067aa0ba902b7"],
      ]);
      // The event carries the request's own trace, not the caller's; no tracestate, no baggage.
      const headers = await eventHeaders(id);
      expect(headers.traceparent).toContain(request!.spanContext().traceId);
      expect(JSON.stringify(headers)).not.toContain(traceId);
      expect(JSON.stringify(headers)).not.toContain("caller-secret");
      expect(headers.baggage).toBeUndefined();
    } finally {
      propagation.disable();
      propagation.setGlobalPropagator(new W3CTraceContextPropagator());
    }
  });

  it("stores the request context's baggage with its events only when configured", async () => {
    withBaggagePropagator();
    const bag = propagation.setBaggage(
      context.active(),
      propagation.createBaggage({ "user.id": { value: "alice" } }),
    );
    const write = () =>
      context.with(bag, () =>
        trace
          .getTracer("test")
          .startActiveSpan("handler", (span) =>
            db
              .transaction((tx) => writeOutbox(tx, { topic: "t", type: "x", payload: {} }))
              .finally(() => span.end()),
          ),
      );
    try {
      const plain = await eventHeaders(await write());
      expect(plain.traceparent).toMatch(/^00-/);
      expect(plain.baggage).toBeUndefined();
      configureTelemetry({ baggageInEvents: true });
      const carried = await eventHeaders(await write());
      expect(carried.baggage).toBe("user.id=alice");
    } finally {
      configureTelemetry({ baggageInEvents: false });
      propagation.disable();
      propagation.setGlobalPropagator(new W3CTraceContextPropagator());
    }
  });

  it("without @opentelemetry/api, a keyed request and its replay answer the same and nothing is traced", async () => {
    sdk.exporter.reset();
    setOtelForTesting(null); // as when the optional peer is not installed
    try {
      const first = await post("key-absent", '{"a":1}');
      const again = await post("key-absent", '{"a":1}');
      expect([first.status, again.status]).toEqual([201, 201]);
      expect(again.headers.get("idempotent-replayed")).toBe("true");
      expect(await again.json()).toEqual(await first.json());
    } finally {
      setOtelForTesting(undefined);
    }
    await sdk.flush();
    expect(sdk.spans()).toEqual([]);
  });

  it.skipIf(serverBackends.length === 0)(
    "marks a duplicate that arrives while the key is held as claim (in_flight) and counts the 409",
    async () => {
      sdk.exporter.reset();
      const send = () =>
        app.request("/slow", {
          method: "POST",
          headers: {
            "idempotency-key": "key-held",
            "x-account": "acct_1",
            "content-type": "application/json",
          },
          body: "{}",
        });
      const first = send();
      await new Promise((r) => setTimeout(r, 150));
      const second = await send();
      release();
      expect(second.status).toBe(409);
      expect((await first).status).toBe(201);
      await sdk.flush();
      expect(sdk.named("idem.claim").map((s) => s.attributes["idem.claim.outcome"])).toEqual([
        "new",
        "in_flight",
      ]);
      expect((await sdk.points("idem.in_flight"))[0]?.value).toBe(1);
    },
  );
});
