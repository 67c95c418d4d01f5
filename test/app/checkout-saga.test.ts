/**
 * The checkout saga of the reference service (app/checkout/): an order that reserves stock, charges the
 * card and ships through outbox and inbox steps, compensated (refund, release) when shipping fails for
 * good. With the in-process broker: each path ends right, the flow shows on the placing key's timeline
 * in the console's API, and the whole saga is one trace. Then under the messaging fault suite, on
 * RabbitMQ and on NATS JetStream: relays killed between claim and publish and between publish and mark,
 * consumers dying after their commit and before their ack, restarted as a process manager would; every
 * step of every checkout happens exactly once, the stock adds up, and the provider charged and
 * refunded exactly what the steps say.
 */
import { trace } from "@opentelemetry/api";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DEMO_ACCOUNTS } from "../../app/accounts.ts";
import { startCheckoutSaga } from "../../app/checkout/worker.ts";
import { DECLINED_TEST_CARD } from "../../app/payments-phases.ts";
import type { Worker } from "../../app/worker.ts";
import { createRng } from "../../src/testing/prng.ts";
import { backends, serverBackends } from "../helpers/db.ts";
import { until } from "../messaging/helpers.ts";
import { installSdk, type Sdk } from "../observability/sdk.ts";
import { KEY_1, type RunningService, startService } from "./service.ts";

const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;
const ACCOUNT = DEMO_ACCOUNTS[0].id;
const AMQP_URL = process.env.AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672";
const NATS_URL = process.env.NATS_URL ?? "nats://127.0.0.1:4222";

type Order = { sku: string; quantity: number; amount_cents: number; country: string; card?: string };

async function place(svc: RunningService, key: string, order: Order, headers: Record<string, string> = {}) {
  const res = await fetch(`${svc.url}/v1/checkouts`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${KEY_1}`,
      "idempotency-key": key,
      "content-type": "application/json",
      ...headers,
    },
    body: JSON.stringify(order),
  });
  expect(res.status).toBe(202);
  return ((await res.json()) as { id: string }).id;
}

const statusOf = async (svc: RunningService, id: string) => {
  const res = await fetch(`${svc.url}/v1/checkouts/${id}`, { headers: { authorization: `Bearer ${KEY_1}` } });
  return (await res.json()) as { status: string; steps: { step: string }[]; charge_id: string | null };
};

const FINAL = new Set(["shipped", "cancelled", "rejected"]);

describe(`the checkout saga, in process (${backend.name})`, () => {
  let svc: RunningService;
  let saga: Worker;
  let sdk: Sdk;
  beforeAll(async () => {
    sdk = installSdk();
    svc = await startService(backend, { paymentsMode: "phases", adminTokens: "ops:token-of-ops-0123456789" });
    svc.provider!.reset();
    saga = await startCheckoutSaga(
      svc.open.db,
      { store: svc.store, providerUrl: svc.providerUrl! },
      { pollMs: 20 },
    );
  });
  afterAll(async () => {
    await saga?.stop();
    await svc?.stop();
    await sdk?.uninstall();
  });

  it("ships, compensates a failed shipment (refund, release), rejects without stock, releases after a decline", async () => {
    const stockBefore = await svc.count("SELECT available AS n FROM stock WHERE sku = 'mug'");
    const shipped = await place(svc, "co-ship", {
      sku: "mug",
      quantity: 2,
      amount_cents: 1_800,
      country: "de",
    });
    const failed = await place(svc, "co-fail", { sku: "mug", quantity: 1, amount_cents: 900, country: "aq" });
    const noStock = await place(svc, "co-none", {
      sku: "lamp",
      quantity: 50,
      amount_cents: 5_000,
      country: "fr",
    });
    const declined = await place(svc, "co-dec", {
      sku: "mug",
      quantity: 1,
      amount_cents: 900,
      country: "fr",
      card: DECLINED_TEST_CARD,
    });
    await until(
      async () =>
        (await Promise.all([shipped, failed, noStock, declined].map((id) => statusOf(svc, id)))).every((c) =>
          FINAL.has(c.status),
        ),
      20_000,
      "every checkout at a final state",
    );
    const steps = async (id: string) => (await statusOf(svc, id)).steps.map((s) => s.step);
    expect(await steps(shipped)).toEqual(["stock-reserved", "charged", "shipped"]);
    expect(await steps(failed)).toEqual([
      "stock-reserved",
      "charged",
      "ship-failed",
      "refunded",
      "stock-released",
    ]);
    expect(await steps(noStock)).toEqual(["stock-rejected"]);
    expect(await steps(declined)).toEqual(["stock-reserved", "charge-declined", "stock-released"]);
    expect((await statusOf(svc, failed)).status).toBe("cancelled");
    // Stock: only the shipped checkout's 2 mugs are gone.
    expect(await svc.count("SELECT available AS n FROM stock WHERE sku = 'mug'")).toBe(stockBefore - 2);
    // The provider: two charges that went through (one refunded), one declined.
    const charges = svc.provider!.charges();
    expect(
      charges
        .filter((ch) => ch.status === "succeeded")
        .map((ch) => ch.amount)
        .sort(),
    ).toEqual([1_800, 900]);
    expect(svc.provider!.refunds().map((r) => [r.charge, r.amount])).toEqual([
      [(await statusOf(svc, failed)).charge_id, 900],
    ]);
    // A retry of the placing request replays: no second checkout.
    expect(await place(svc, "co-ship", { sku: "mug", quantity: 2, amount_cents: 1_800, country: "de" })).toBe(
      shipped,
    );
  });

  it("shows the flow on the placing key's timeline in the console (its admin API)", async () => {
    const res = await fetch(`${svc.url}/admin/api/keys/find?scope=${ACCOUNT}&key=co-fail`, {
      headers: { authorization: "Bearer token-of-ops-0123456789" },
    });
    expect(res.status).toBe(200);
    const story = (await res.json()) as { timeline: { kind: string; text: string }[] };
    const notes = story.timeline.filter((e) => e.kind === "note").map((e) => e.text);
    expect(notes).toEqual([
      "stock-reserved: reserved 1 x mug",
      expect.stringMatching(/^charged: charged 900 eur \(ch_/),
      'ship-failed: the carrier does not ship to "aq": compensating',
      expect.stringMatching(/^refunded: refunded 900 eur \(re_/),
      "stock-released: released 1 x mug: the checkout is cancelled",
    ]);
  });

  it("is one trace from the request on, linked to the customer's: every publish and process of its events", async () => {
    const tracer = trace.getTracer("test");
    const id = await tracer.startActiveSpan("customer checks out", async (span) => {
      const traceparent = `00-${span.spanContext().traceId}-${span.spanContext().spanId}-01`;
      try {
        return await place(
          svc,
          "co-traced",
          { sku: "poster", quantity: 1, amount_cents: 1_200, country: "aq" },
          { traceparent },
        );
      } finally {
        span.end();
      }
    });
    await until(async () => FINAL.has((await statusOf(svc, id)).status), 20_000, "the traced checkout done");
    await until(
      async () => {
        await sdk.flush();
        return sdk.spans().filter((s) => s.name === "process checkout").length >= 5;
      },
      10_000,
      "the consumer spans ended",
    );
    const root = sdk.named("customer checks out")[0]!;
    // A public route: the checkout starts a trace of its own, linked to the customer's (issue 57).
    const request = sdk
      .named("idem.request")
      .find((s) => s.links.some((l) => l.context.traceId === root.spanContext().traceId));
    expect(request).toBeDefined();
    expect(request!.spanContext().traceId).not.toBe(root.spanContext().traceId);
    const mine = sdk.spans().filter((s) => s.spanContext().traceId === request!.spanContext().traceId);
    const names = mine.map((s) => s.name);
    // placed, stock.reserved, payment.charged, shipment.failed, payment.refunded: each published and processed.
    expect(names.filter((n) => n === "publish checkout")).toHaveLength(5);
    expect(names.filter((n) => n === "process checkout")).toHaveLength(5);
    expect(
      mine
        .filter((s) => s.name === "process checkout")
        .map((s) => s.attributes["idem.event.type"])
        .sort(),
    ).toEqual([
      "checkout.placed",
      "payment.charged",
      "payment.refunded",
      "shipment.failed",
      "stock.reserved",
    ]);
  });
});

const server = serverBackends.find((b) => b.name === "pg");
describe.skipIf(!server).each([
  { broker: "RabbitMQ", config: (ns: string) => ({ amqpUrl: AMQP_URL, namespace: ns }) },
  {
    broker: "NATS JetStream",
    config: (ns: string) => ({ natsUrl: NATS_URL, namespace: ns, ackWaitMs: 1_000 }),
  },
])("the checkout saga under the messaging fault suite on $broker", ({ config }) => {
  let svc: RunningService;
  beforeAll(async () => {
    svc = await startService(server!, { paymentsMode: "phases" });
    await svc.open.db.query("UPDATE stock SET available = 100000 WHERE sku = 'mug'");
  });
  afterAll(async () => {
    await svc?.stop();
  });

  it("takes every step of 40 checkouts exactly once with relays killed and consumers crashing before their ack", async () => {
    const rng = createRng(7);
    const ns = `t${Math.floor(Math.random() * 1e9).toString(36)}_`;
    let relayKills = 0;
    let consumerCrashes = 0;
    let running = true;
    let current: Worker | undefined;
    const start = async (): Promise<Worker> =>
      startCheckoutSaga(
        svc.open.db,
        { store: svc.store, providerUrl: svc.providerUrl! },
        { ...config(ns), pollMs: 20, log: () => {} },
        {
          relayCrash: () => relayKills < 12 && rng.next() < 0.08 && ++relayKills > 0,
          consumerCrash: () => consumerCrashes < 12 && rng.next() < 0.08 && ++consumerCrashes > 0,
          relayLeaseMs: 500,
        },
      );
    // A supervisor: whatever dies is replaced, as a process manager would.
    const supervise = (async () => {
      while (running) {
        const w = await start();
        current = w;
        await until(
          async () =>
            !running ||
            !w.relay.running ||
            (await Promise.race([
              w.consumer.closed.then(() => true),
              new Promise<boolean>((r) => setTimeout(() => r(false), 20)),
            ])),
          120_000,
          "a crash or the end",
        );
        await w.stop().catch(() => {});
      }
    })();
    const ids: string[] = [];
    try {
      for (let i = 0; i < 40; i++) {
        const country = i % 4 === 3 ? "aq" : "nl"; // every 4th fails shipping: compensated
        ids.push(
          await place(svc, `fault-${ns}${i}`, { sku: "mug", quantity: 1, amount_cents: 500 + i, country }),
        );
      }
      await until(
        async () => {
          const { rows } = await svc.open.db.query<{ n: number }>(
            "SELECT count(*)::int AS n FROM checkouts WHERE id = ANY($1) AND status IN ('shipped', 'cancelled')",
            [ids],
          );
          return rows[0]!.n === ids.length;
        },
        90_000,
        "every checkout shipped or cancelled",
      );
    } finally {
      running = false;
      await supervise;
      void current;
    }
    expect(relayKills + consumerCrashes).toBeGreaterThan(0);
    const { rows } = await svc.open.db.query<{ id: string; steps: string[] }>(
      `SELECT c.id, array_agg(s.step ORDER BY s.at) AS steps FROM checkouts c JOIN checkout_steps s ON s.checkout_id = c.id
        WHERE c.id = ANY($1) GROUP BY c.id`,
      [ids],
    );
    const byId = new Map(rows.map((r) => [r.id, r.steps]));
    ids.forEach((id, i) => {
      expect(byId.get(id)).toEqual(
        i % 4 === 3
          ? ["stock-reserved", "charged", "ship-failed", "refunded", "stock-released"]
          : ["stock-reserved", "charged", "shipped"],
      );
    });
    // The provider: one charge per checkout, one refund per compensated one, whatever was redelivered.
    const refs = new Set(ids.map((id) => `${ACCOUNT}:checkout:${id}`));
    const charges = svc.provider!.charges().filter((c) => c.reference && refs.has(c.reference));
    expect(charges).toHaveLength(40);
    const refunded = new Set(svc.provider!.refunds().map((r) => r.charge));
    expect(charges.filter((c) => refunded.has(c.id))).toHaveLength(10);
    // Stock: 30 shipped, 10 reserved and released.
    expect(await svc.count("SELECT available AS n FROM stock WHERE sku = 'mug'")).toBe(100_000 - 30);
    console.log(
      `checkout saga: ${relayKills} relay kills, ${consumerCrashes} consumer crashes before the ack`,
    );
  }, 150_000);
});
