/**
 * One trace from a request to the consumer of its event, through real brokers: the payment's handler
 * writes an outbox event (its trace context goes into the row's headers), the relay publishes it
 * (`publish <topic>`, child of the handler's work span) to RabbitMQ or NATS JetStream, and the
 * consumer's `process <topic>` span continues that trace, ended with the inbox's result. Re-publishing
 * the same event shows the inbox's duplicate skip. Real PostgreSQL, RabbitMQ and NATS on 127.0.0.1.
 */

import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { jetstreamManager, StorageType } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import type { ReadableSpan } from "@opentelemetry/sdk-trace";
import amqp from "amqplib";
import { Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { idempotency } from "../../src/http/hono.ts";
import { AmqpPublisher, consumeAmqp } from "../../src/messaging/amqp.ts";
import type { RunningConsumer } from "../../src/messaging/consumer.ts";
import { Inbox } from "../../src/messaging/inbox.ts";
import { consumeNats, NatsPublisher } from "../../src/messaging/nats.ts";
import { Relay } from "../../src/messaging/relay.ts";
import type { Publisher } from "../../src/messaging/types.ts";
import { WebhookPublisher } from "../../src/messaging/webhook.ts";
import type { Db } from "../../src/postgres/db.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { type OpenDb, sayWhySkippedWithoutServer, serverBackends } from "../helpers/db.ts";
import { AMQP_URL, NATS_URL, prepare, record, unique, until } from "../messaging/helpers.ts";
import { type PaymentApi, pay, startPaymentApi } from "./payment.ts";
import { installSdk, type Sdk, tree } from "./sdk.ts";

sayWhySkippedWithoutServer();
const backend = serverBackends.find((b) => b.name === "pg");

const label = (s: ReadableSpan) => {
  const a = s.attributes;
  const extra = a["idem.claim.outcome"] ?? a["http.request.resend_count"] ?? a["idem.inbox.result"];
  return extra === undefined ? s.name : `${s.name} [${extra}]`;
};

describe.skipIf(!backend)("a payment's trace through the outbox, a broker and the inbox", () => {
  let sdk: Sdk;
  let open: OpenDb;
  let db: Db;

  beforeAll(async () => {
    sdk = installSdk();
    open = await backend!.open();
    db = open.db;
    await prepare(db);
  });
  afterAll(async () => {
    await open?.close();
    await sdk?.uninstall();
  });

  async function run(topic: string, publisher: Publisher, consumer: RunningConsumer, redeliver: boolean) {
    sdk.exporter.reset();
    const api: PaymentApi = await startPaymentApi(db, topic);
    const relay = new Relay({ db, publisher, topics: [topic], pollMs: 20 });
    await relay.start();
    try {
      expect((await pay(api)).status).toBe(201);
      await until(() => consumer.stats.applied >= 1, 10_000, "the payment's event applied");
      if (redeliver) {
        // The relay publishes the same event again (as after a crash before marking it published).
        await db.query("UPDATE idem.outbox SET published_at = NULL WHERE topic = $1", [topic]);
        relay.wake();
        await until(() => consumer.stats.duplicates >= 1, 10_000, "the second copy skipped");
      }
    } finally {
      await relay.stop();
      await consumer.stop();
      await publisher.close();
      await api.close();
    }
    await sdk.flush();
    return sdk.spans();
  }

  it("RabbitMQ: request -> outbox -> publish -> process (applied), and a second copy (duplicate)", async () => {
    const queue = unique("idem_otel");
    const admin = await amqp.connect(AMQP_URL);
    const ch = await admin.createChannel();
    await ch.assertQueue(queue, { durable: false });
    try {
      const consumer = await consumeAmqp({
        url: AMQP_URL,
        queue,
        inbox: new Inbox(db, { consumer: queue }),
        handler: record,
      });
      const spans = await run(queue, new AmqpPublisher({ url: AMQP_URL }), consumer, true);
      expect(tree(spans, label)).toEqual([
        "idem.intent",
        "  POST",
        "    idem.request",
        "      idem.claim [new]",
        "      idem.work",
        `        publish ${queue}`,
        `          process ${queue} [applied]`,
        `        publish ${queue}`,
        `          process ${queue} [duplicate]`,
        "      idem.save",
        "  POST [1]",
        "    idem.request",
        "      idem.claim [replayed]",
      ]);
      expect(new Set(spans.map((s) => s.spanContext().traceId)).size).toBe(1);
      const publish = spans.find((s) => s.name === `publish ${queue}`)!;
      expect(publish.attributes["messaging.system"]).toBe("amqp");
      expect(publish.attributes["messaging.message.id"]).toMatch(/^[0-9a-f-]{36}$/);
      const results = await sdk.points("idem.inbox.results");
      const dup = results.find((p) => p.attributes["idem.inbox.result"] === "duplicate");
      expect(dup?.value).toBeGreaterThanOrEqual(1);
      expect((await sdk.points("idem.relay.lag")).length).toBeGreaterThan(0);
    } finally {
      await ch.deleteQueue(queue).catch(() => {});
      await admin.close();
    }
  });

  it("NATS JetStream: the consumer's span continues the request's trace", async () => {
    const nc = await connect({ servers: NATS_URL });
    const jsm = await jetstreamManager(nc);
    const stream = unique("IDEM_OTEL");
    const subject = `${stream}.payments`;
    await jsm.streams.add({ name: stream, subjects: [`${stream}.>`], storage: StorageType.Memory });
    try {
      const consumer = await consumeNats({
        servers: NATS_URL,
        stream,
        durable: "receipts",
        create: { filterSubject: subject },
        inbox: new Inbox(db, { consumer: stream }),
        handler: record,
      });
      const spans = await run(subject, new NatsPublisher({ servers: NATS_URL }), consumer, false);
      const [work] = spans.filter((s) => s.name === "idem.work");
      const publish = spans.find((s) => s.name === `publish ${subject}`)!;
      const process = spans.find((s) => s.name === `process ${subject}`)!;
      expect(publish.parentSpanContext?.spanId).toBe(work!.spanContext().spanId);
      expect(process.parentSpanContext?.spanId).toBe(publish.spanContext().spanId);
      expect(process.spanContext().traceId).toBe(work!.spanContext().traceId);
      expect(process.attributes["idem.inbox.result"]).toBe("applied");
    } finally {
      await jsm.streams.delete(stream).catch(() => {});
      await nc.close();
    }
  });

  it("webhooks: the receiving idem endpoint's span continues the trace from the webhook's traceparent", async () => {
    sdk.exporter.reset();
    const topic = unique("otel_hook");
    const store = await PostgresStore.open(db);
    const receiver = new Hono();
    receiver.post("/hooks", idempotency({ store, scope: () => "webhooks" }), (c) => c.json({ ok: true }));
    const server = createServer(async (req, res) => {
      const chunks: Buffer[] = [];
      for await (const chunk of req) chunks.push(chunk as Buffer);
      const headers = new Headers();
      for (const [k, v] of Object.entries(req.headers)) if (typeof v === "string") headers.set(k, v);
      const r = await receiver.fetch(
        new Request(`http://local${req.url}`, { method: "POST", headers, body: Buffer.concat(chunks) }),
      );
      res.writeHead(r.status, Object.fromEntries(r.headers));
      res.end(Buffer.from(await r.arrayBuffer()));
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`;
    const api = await startPaymentApi(db, topic);
    const relay = new Relay({
      db,
      publisher: new WebhookPublisher({ url, secret: "whsec_test" }),
      topics: [topic],
      pollMs: 20,
    });
    await relay.start();
    try {
      expect((await pay(api)).status).toBe(201);
      await until(
        async () =>
          (await db.query("SELECT 1 FROM idem.outbox WHERE topic = $1 AND published_at IS NOT NULL", [topic]))
            .rows.length === 1,
        10_000,
        "the webhook delivered",
      );
    } finally {
      await relay.stop();
      await api.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
    await sdk.flush();
    const spans = sdk.spans();
    const publish = spans.find((s) => s.name === `publish ${topic}`)!;
    expect(publish.attributes["messaging.system"]).toBe("webhook");
    const received = spans.filter(
      (s) => s.name === "idem.request" && s.parentSpanContext?.spanId === publish.spanContext().spanId,
    );
    expect(received).toHaveLength(1);
    expect(received[0]!.spanContext().traceId).toBe(publish.spanContext().traceId);
  });
});
