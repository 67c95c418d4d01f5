/**
 * The receiver end to end on its Web adapter (`receiver.fetch`), on PGlite and the real PostgreSQL:
 * each hostile delivery answers the right status and leaves exactly one effect (or none).
 */
import { randomUUID } from "node:crypto";
import { beforeEach, describe, expect, it } from "vitest";
import { parkedMessages, unparkMessage } from "../../src/admin/index.ts"; // idem/admin: what the console lists
import type { Db } from "../../src/postgres/db.ts";
import { githubScheme } from "../../src/webhooks/github.ts";
import { WebhookReceiver, webhookReceiver } from "../../src/webhooks/receiver.ts";
import { standardWebhooksScheme } from "../../src/webhooks/standard.ts";
import { stripeScheme } from "../../src/webhooks/stripe.ts";
import type { WebhookHandler } from "../../src/webhooks/types.ts";
import { backends } from "../helpers/db.ts";
import {
  type Delivery,
  effectCount,
  GITHUB_SECRET,
  githubDelivery,
  logEffect,
  paymentIntentEvent,
  request,
  STANDARD_SECRET,
  STRIPE_SECRET,
  standardDelivery,
  stripeDelivery,
  useWebhookDb,
} from "./senders.ts";

const URL = "http://receiver.test/webhooks";
const now = () => Math.floor(Date.now() / 1000);

/** The handler of these tests: log the effect, and keep the intent's latest state by event time. */
function intents(
  consumer: string,
): WebhookHandler<{ data: { object: { id: string; status: string; amount: number } } }> {
  return async (event, { tx, applyIfNewer }) => {
    await logEffect(tx, consumer, event.id);
    const pi = event.payload.data.object;
    await applyIfNewer({
      table: "intents",
      key: { id: pi.id },
      values: { status: pi.status, amount: pi.amount },
    });
  };
}

async function send(
  receiver: WebhookReceiver<never> | WebhookReceiver<unknown> | WebhookReceiver<any>,
  d: Delivery,
) {
  const res = await receiver.fetch(request(URL, d));
  const text = await res.text();
  return {
    status: res.status,
    body: text ? JSON.parse(text) : undefined,
    type: res.headers.get("content-type"),
  };
}

describe.each(backends)("webhook receiver on $name", (backend) => {
  const database = useWebhookDb(backend);
  let db: Db;
  beforeEach(() => {
    db = database();
  });

  const stripeReceiver = (
    consumer: string,
    extra: { secret?: string | string[]; maxAttempts?: number } = {},
  ) =>
    webhookReceiver({
      db,
      consumer,
      scheme: stripeScheme({ secret: extra.secret ?? STRIPE_SECRET }),
      handler: intents(consumer),
      maxAttempts: extra.maxAttempts,
      onError: () => {},
    });

  it("applies an event once: the first delivery 200 applied, every redelivery 200 duplicate", async () => {
    const consumer = `c-${randomUUID()}`;
    const receiver = stripeReceiver(consumer);
    const d = stripeDelivery(paymentIntentEvent("evt_once", `pi_${consumer}`, "succeeded", now()));
    expect(await send(receiver, d)).toMatchObject({
      status: 200,
      body: { result: "applied", id: "evt_once" },
    });
    for (let i = 0; i < 3; i++)
      expect(await send(receiver, d)).toMatchObject({ status: 200, body: { result: "duplicate" } });
    expect(await effectCount(db, consumer)).toBe(1);
  });

  it("answers 401/400 problem+json to a tampered body, a wrong secret, an old timestamp and missing headers, and applies nothing", async () => {
    const consumer = `c-${randomUUID()}`;
    const receiver = stripeReceiver(consumer);
    const event = paymentIntentEvent("evt_bad", `pi_${consumer}`, "succeeded", now());
    const good = stripeDelivery(event);
    const cases: [Delivery, number][] = [
      [{ ...good, body: good.body.replace("5000", "1") }, 401],
      [stripeDelivery(event, { secret: "whsec_wrong" }), 401],
      [stripeDelivery(event, { timestamp: now() - 3600 }), 401],
      [{ headers: { "content-type": "application/json" }, body: good.body }, 400],
    ];
    for (const [d, status] of cases) {
      const r = await send(receiver, d);
      expect(r.status).toBe(status);
      expect(r.type).toBe("application/problem+json");
    }
    expect(await effectCount(db, consumer)).toBe(0);
    expect(await receiver.inbox.statusOf("evt_bad")).toBeNull(); // nothing marked: the real one still applies
    expect(await send(receiver, good)).toMatchObject({ status: 200, body: { result: "applied" } });
  });

  it("50 concurrent deliveries of one event: all answered 200, one effect", async () => {
    const consumer = `c-${randomUUID()}`;
    const receiver = stripeReceiver(consumer);
    const d = stripeDelivery(paymentIntentEvent("evt_50", `pi_${consumer}`, "succeeded", now()));
    const answers = await Promise.all(Array.from({ length: 50 }, () => send(receiver, d)));
    expect(answers.map((a) => a.status)).toEqual(Array(50).fill(200));
    expect(answers.filter((a) => a.body.result === "applied")).toHaveLength(1);
    expect(await effectCount(db, consumer)).toBe(1);
  });

  it("concurrent deliveries share transactions; one failing handler among them fails only its own delivery", async () => {
    const consumer = `c-${randomUUID()}`;
    const receiver = webhookReceiver({
      db,
      consumer,
      maxAttempts: 10,
      scheme: stripeScheme({ secret: STRIPE_SECRET }),
      onError: () => {},
      handler: async (event, { tx }) => {
        await logEffect(tx, consumer, event.id);
        if (event.id === "evt_bad_7") throw new Error("cannot apply event 7");
      },
    });
    const ids = Array.from({ length: 24 }, (_, i) => (i === 7 ? "evt_bad_7" : `evt_ok_${i}`));
    // Each event twice, all at once: the copies meet within a batch or across batches.
    const deliveries = [...ids, ...ids].map((id) =>
      stripeDelivery(paymentIntentEvent(id, `pi_${id}`, "succeeded", now())),
    );
    const answers = await Promise.all(deliveries.map((d) => send(receiver, d)));
    const byId = new Map<string, string[]>();
    answers.forEach((a, i) => {
      const id = ids[i % ids.length]!;
      byId.set(id, [...(byId.get(id) ?? []), a.status === 200 ? a.body.result : String(a.status)]);
    });
    expect(byId.get("evt_bad_7")).toEqual(["500", "500"]);
    for (const id of ids.filter((x) => x !== "evt_bad_7"))
      expect(byId.get(id)!.sort()).toEqual(["applied", "duplicate"]);
    expect(await effectCount(db, consumer)).toBe(23);
    expect(await effectCount(db, consumer, "evt_bad_7")).toBe(0);
  });

  it("out-of-order payment_intent events: the latest state wins, an older one is acknowledged and recorded stale", async () => {
    const consumer = `c-${randomUUID()}`;
    const receiver = stripeReceiver(consumer);
    const pi = `pi_${consumer}`;
    const t = now() - 60;
    const created = stripeDelivery(paymentIntentEvent("evt_a", pi, "requires_payment_method", t));
    const processing = stripeDelivery(paymentIntentEvent("evt_b", pi, "processing", t + 1));
    const succeeded = stripeDelivery(paymentIntentEvent("evt_c", pi, "succeeded", t + 5));
    // Delivered: succeeded, created, succeeded again, processing.
    expect((await send(receiver, succeeded)).body.result).toBe("applied");
    expect((await send(receiver, created)).body).toMatchObject({ result: "stale" });
    expect((await send(receiver, succeeded)).body.result).toBe("duplicate");
    expect((await send(receiver, processing)).body.result).toBe("stale");
    const { rows } = await db.query<{ status: string }>("SELECT status FROM intents WHERE id = $1", [pi]);
    expect(rows[0]!.status).toBe("succeeded");
    expect(await receiver.inbox.statusOf("evt_a")).toBe("stale");
    expect(await receiver.inbox.statusOf("evt_c")).toBe("done");
    expect((await send(receiver, processing)).body.result).toBe("duplicate"); // a stale event is not retried
  });

  it("a failing handler answers 500 (nothing applied) until it is parked after maxAttempts, visible to the admin", async () => {
    const consumer = `c-${randomUUID()}`;
    let fail = true;
    const receiver = webhookReceiver({
      db,
      consumer,
      maxAttempts: 3,
      scheme: stripeScheme({ secret: STRIPE_SECRET }),
      onError: () => {},
      handler: async (event, { tx }) => {
        await logEffect(tx, consumer, event.id);
        if (fail) throw new Error("the ledger refused it");
      },
    });
    const d = stripeDelivery(paymentIntentEvent("evt_poison", `pi_${consumer}`, "succeeded", now()));
    const statuses = [];
    for (let i = 0; i < 4; i++) statuses.push((await send(receiver, d)).status);
    expect(statuses).toEqual([500, 500, 200, 200]); // 3rd: parked; 4th: a copy of a parked event
    expect(await effectCount(db, consumer)).toBe(0);
    const parked = await parkedMessages(db, { consumer });
    expect(parked).toHaveLength(1);
    expect(parked[0]).toMatchObject({
      messageId: "evt_poison",
      attempts: 3,
      lastError: "the ledger refused it",
      type: "payment_intent.succeeded",
    });
    expect(JSON.parse(parked[0]!.body).id).toBe("evt_poison");
    // Fixed and unparked: the next delivery applies it, once.
    fail = false;
    expect(await unparkMessage(db, consumer, "evt_poison")).toBe(true);
    expect((await send(receiver, d)).body.result).toBe("applied");
    expect((await send(receiver, d)).body.result).toBe("duplicate");
    expect(await effectCount(db, consumer)).toBe(1);
  });

  it("a secret rotated mid-stream: old-secret and new-secret deliveries both apply once; after the old is dropped, it is refused", async () => {
    const consumer = `c-${randomUUID()}`;
    const during = stripeReceiver(consumer, { secret: ["whsec_old_one", STRIPE_SECRET] });
    const pi = `pi_${consumer}`;
    const events = [0, 1, 2, 3].map((i) =>
      paymentIntentEvent(`evt_rot_${i}`, pi, "processing", now() - 10 + i),
    );
    expect((await send(during, stripeDelivery(events[0]!, { secret: "whsec_old_one" }))).status).toBe(200);
    expect((await send(during, stripeDelivery(events[1]!))).status).toBe(200);
    // The sender retries event 0, now signed with the new secret: a duplicate, not a second effect.
    expect((await send(during, stripeDelivery(events[0]!))).body.result).toBe("duplicate");
    const after = stripeReceiver(consumer);
    expect((await send(after, stripeDelivery(events[2]!, { secret: "whsec_old_one" }))).status).toBe(401);
    expect((await send(after, stripeDelivery(events[3]!))).status).toBe(200);
    expect(await effectCount(db, consumer)).toBe(3);
  });

  it("Standard Webhooks and GitHub deliveries are deduplicated the same way", async () => {
    const consumer = `c-${randomUUID()}`;
    const seen: string[] = [];
    const log: WebhookHandler = async (event, { tx }) => {
      seen.push(event.type);
      await logEffect(tx, consumer, event.id);
    };
    const standard = webhookReceiver({
      db,
      consumer: `${consumer}-sw`,
      scheme: standardWebhooksScheme({ secret: STANDARD_SECRET }),
      handler: log,
    });
    const github = webhookReceiver({
      db,
      consumer: `${consumer}-gh`,
      scheme: githubScheme({ secret: GITHUB_SECRET }),
      handler: log,
    });
    const sw = standardDelivery("msg_1", {
      type: "invoice.paid",
      timestamp: new Date().toISOString(),
      data: {},
    });
    const gh = await githubDelivery(randomUUID(), "push", { ref: "refs/heads/main" });
    for (let i = 0; i < 3; i++) {
      expect((await send(standard, sw)).status).toBe(200);
      expect((await send(github, gh)).status).toBe(200);
    }
    expect(seen.sort()).toEqual(["invoice.paid", "push"]);
    expect(await effectCount(db, consumer)).toBe(2);
  });

  it("acknowledges on receipt (202), then a relay applies each event once through the inbox", async () => {
    const consumer = `c-${randomUUID()}`;
    let failFirst = true;
    const receiver = webhookReceiver({
      db,
      consumer,
      acknowledge: "on-receipt",
      scheme: stripeScheme({ secret: STRIPE_SECRET }),
      onError: () => {},
      handler: async (event, ctx) => {
        if (failFirst) {
          failFirst = false;
          throw new Error("busy");
        }
        await intents(consumer)(event as never, ctx);
      },
    });
    const pi = `pi_${consumer}`;
    const a = stripeDelivery(paymentIntentEvent("evt_q1", pi, "processing", now() - 5));
    const b = stripeDelivery(paymentIntentEvent("evt_q2", pi, "succeeded", now()));
    const answers = [await send(receiver, b), await send(receiver, a), await send(receiver, b)];
    expect(answers.map((x) => [x.status, x.body.result])).toEqual([
      [202, "queued"],
      [202, "queued"],
      [202, "queued"],
    ]);
    expect(await effectCount(db, consumer)).toBe(0); // answered before anything was applied
    const relay = receiver.startWorker({ pollMs: 20, backoff: { baseMs: 20, capMs: 50 } });
    try {
      await expect.poll(() => effectCount(db, consumer), { timeout: 15_000, interval: 50 }).toBe(2);
      await expect
        .poll(
          async () =>
            (
              await db.query<{ n: string }>(
                "SELECT count(*) AS n FROM idem.outbox WHERE topic = $1 AND published_at IS NULL",
                [receiver.topic],
              )
            ).rows[0]!.n,
          { timeout: 15_000 },
        )
        .toEqual(expect.toSatisfy((n) => Number(n) === 0));
    } finally {
      await relay.stop();
    }
    const { rows } = await db.query<{ status: string }>("SELECT status FROM intents WHERE id = $1", [pi]);
    expect(rows[0]!.status).toBe("succeeded");
    // Once applied, a redelivery is answered 200 duplicate without being stored again.
    expect((await send(receiver, b)).body.result).toBe("duplicate");
  });

  it("a signed body that is not an event answers 400; the database down answers 503 with Retry-After", async () => {
    const consumer = `c-${randomUUID()}`;
    expect((await send(stripeReceiver(consumer), stripeDelivery("not json"))).status).toBe(400);
    const down = () => Promise.reject(Object.assign(new Error("terminating connection"), { code: "57P01" }));
    const gone: Db = { ...db, query: down, exec: down, transaction: down } as Db;
    const receiver = webhookReceiver({
      db: gone,
      consumer,
      scheme: stripeScheme({ secret: STRIPE_SECRET }),
      handler: intents(consumer),
      onError: () => {},
    });
    const res = await receiver.fetch(
      request(URL, stripeDelivery(paymentIntentEvent("evt_down", "pi_down", "succeeded", now()))),
    );
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBe("1");
    expect(
      new WebhookReceiver({ db, scheme: stripeScheme({ secret: STRIPE_SECRET }), handler: async () => {} })
        .inbox.consumer,
    ).toBe("webhook:stripe");
  });
});
