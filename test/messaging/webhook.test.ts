/** Webhooks: signed POSTs with the event id, one attempt per publish (the relay retries), verifiable by the receiver. */
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { Relay } from "../../src/messaging/relay.ts";
import type { OutboxMessage } from "../../src/messaging/types.ts";
import {
  signWebhook,
  verifyWebhook,
  WebhookPublisher,
  WebhookVerificationError,
} from "../../src/messaging/webhook.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { backends } from "../helpers/db.ts";
import { prepare, until } from "./helpers.ts";

const SECRET = `whsec_${Buffer.from("a shared secret of 32 bytes.....").toString("base64")}`;

interface Received {
  headers: IncomingMessage["headers"];
  body: string;
}

const servers: Server[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) {
    s.closeAllConnections(); // fetch keeps connections alive
    await new Promise((r) => s.close(r));
  }
});

/** A receiver answering with `statuses` in turn (then 200), recording every request. */
async function receiver(statuses: number[] = []): Promise<{ url: string; received: Received[] }> {
  const received: Received[] = [];
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => {
      body += c;
    });
    req.on("end", () => {
      received.push({ headers: req.headers, body });
      res.statusCode = statuses.shift() ?? 200;
      res.end();
    });
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`, received };
}

function event(id: string, payload: unknown = { amount_cents: 500 }): OutboxMessage {
  return {
    id,
    topic: "payments",
    type: "payment.succeeded",
    body: JSON.stringify(payload),
    headers: { "x-tenant": "acme" },
    aggregateType: null,
    aggregateId: null,
    attempts: 0,
    createdAt: new Date("2026-01-02T03:04:05Z"),
  };
}

describe("webhook publisher", () => {
  it("POSTs each event once, signed, with the event id as webhook-id and Idempotency-Key", async () => {
    const { url, received } = await receiver();
    const publisher = new WebhookPublisher({ url, secret: SECRET });
    const outcomes = await publisher.publish([event("0190-a"), event("0190-b")]);
    expect(outcomes).toEqual([{ ok: true }, { ok: true }]);
    expect(received).toHaveLength(2);
    const r = received.find((x) => x.headers["webhook-id"] === "0190-a")!;
    expect(r.headers["idempotency-key"]).toBe("0190-a");
    expect(r.headers["x-tenant"]).toBe("acme");
    const verified = verifyWebhook(SECRET, r.headers as Record<string, string>, r.body);
    expect(verified.id).toBe("0190-a");
    expect(verified.body).toEqual({
      type: "payment.succeeded",
      timestamp: "2026-01-02T03:04:05.000Z",
      data: { amount_cents: 500 },
    });
  });

  it("sends each event once per publish: a 503 fails that event only, and nothing is retried inside", async () => {
    const { url, received } = await receiver([503]);
    const publisher = new WebhookPublisher({ url, secret: SECRET, concurrency: 1 });
    const [failed, ok] = await publisher.publish([event("e1"), event("e2")]);
    expect(failed).toMatchObject({ ok: false });
    expect(!failed!.ok && failed!.error.message).toMatch(/answered 503/);
    expect(ok).toEqual({ ok: true });
    expect(received.map((r) => r.headers["webhook-id"])).toEqual(["e1", "e2"]);
  });

  it("is retried by the relay alone: two 503s cost three requests with the same id, then it is published", async () => {
    const open = await backends[0]!.open();
    try {
      await prepare(open.db);
      const id = await open.db.transaction((tx) =>
        writeOutbox(tx, { topic: "hooks", type: "payment.succeeded", payload: { amount_cents: 500 } }),
      );
      const { url, received } = await receiver([503, 503]);
      const relay = new Relay({
        db: open.db,
        publisher: new WebhookPublisher({ url, secret: SECRET }),
        backoff: { baseMs: 5, capMs: 20 },
        pollMs: 10,
      });
      await relay.start();
      try {
        await until(() => relay.stats.published === 1, 10_000, "the webhook published");
      } finally {
        await relay.stop();
      }
      expect(received.map((r) => r.headers["webhook-id"])).toEqual([id, id, id]);
      expect(received.map((r) => r.headers["idempotency-key"])).toEqual([id, id, id]);
      const { rows } = await open.db.query<{ attempts: number }>("SELECT attempts FROM idem.outbox");
      expect(rows.map((r) => Number(r.attempts))).toEqual([2]);
    } finally {
      await open.close();
    }
  });

  it("reports a 400 as a failure of that event only", async () => {
    const rejecting = await receiver([400]);
    const p2 = new WebhookPublisher({ url: rejecting.url, secret: SECRET, concurrency: 1 });
    const [bad, good] = await p2.publish([event("e2"), event("e3")]);
    expect(bad).toMatchObject({ ok: false });
    expect(!bad!.ok && bad!.error.message).toMatch(/answered 400/);
    expect(good).toEqual({ ok: true });
  });

  it("lets the receiver reject a tampered body, a wrong secret and a stale timestamp", () => {
    const body = '{"type":"t","timestamp":"x","data":{"amount_cents":500}}';
    const headers = signWebhook(SECRET, "evt-1", body, 1_700_000_000);
    expect(verifyWebhook(SECRET, headers, body, { nowS: 1_700_000_010 }).id).toBe("evt-1");
    expect(() =>
      verifyWebhook(SECRET, headers, body.replace("500", "5000"), { nowS: 1_700_000_010 }),
    ).toThrow(WebhookVerificationError);
    expect(() => verifyWebhook("whsec_b3RoZXI=", headers, body, { nowS: 1_700_000_010 })).toThrow(
      /does not match/,
    );
    expect(() => verifyWebhook(SECRET, headers, body, { nowS: 1_700_000_000 + 3_600 })).toThrow(/window/);
    expect(() => verifyWebhook(SECRET, new Headers(), body)).toThrow(/missing/);
  });
});
