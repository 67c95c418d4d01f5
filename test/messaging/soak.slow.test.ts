/**
 * Issue 33, the short version of `npm run bench -- soak`: 20,000 events through outbox -> ordered relay
 * -> broker -> inbox on RabbitMQ and on NATS JetStream, the heap measured after forced collections
 * along the way. Fails when the heap grows more than 200 bytes per event (the AmqpPublisher leak was
 * about 1,600), or when an event is lost, applied twice or out of order. Robust on a busy machine: no
 * timing is asserted, and the heap is compared at its lowest in two windows (in-flight batches and
 * prefetched deliveries come and go between samples).
 */
import { describe, expect, it } from "vitest";
import { growthPerItem, SOAK_BROKERS, soakMessaging } from "../../bench/soak.ts";
import { serverBackends } from "../helpers/db.ts";

const backend = serverBackends.find((b) => b.name === "pg");
const EVENTS = 20_000;

describe.skipIf(!backend)("a long run in short: bounded memory", () => {
  for (const [name, make] of Object.entries(SOAK_BROKERS)) {
    it(`${name}: 20,000 events applied once each and in order, the heap growing under 200 B per event`, async () => {
      const r = await soakMessaging(make, { events: EVENTS, sampleEvery: 1_000, aggregates: 40 });
      const perEvent = growthPerItem(r);
      console.log(
        `${r.name}: ${EVENTS} events in ${r.seconds.toFixed(1)} s, heap ${r.samples[0]!.heapMB.toFixed(1)} -> ${r.samples.at(-1)!.heapMB.toFixed(1)} MB, ${perEvent.toFixed(0)} B per event`,
      );
      expect(r.check).toEqual({ total: EVENTS, distinct: EVENTS, outOfOrder: 0 });
      expect(perEvent).toBeLessThan(200);
    }, 120_000);
  }
});
