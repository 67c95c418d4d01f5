/**
 * Issue 60's soak on Kafka: IDEM_KAFKA_SOAK_EVENTS events (default 200,000 here; the 1,000,000 run is
 * `SOAK_BROKERS=kafka SOAK_PART=messaging npm run bench -- soak`) through outbox -> ordered relay ->
 * Kafka -> consumer group -> inbox, the producer writing meanwhile, the heap sampled after forced
 * collections. Fails when the heap grows 100 bytes per event or more, or when an event is lost, applied
 * twice or out of order. No timing is asserted.
 */
import { describe, expect, it } from "vitest";
import { growthPerItem, kafkaSoak, soakMessaging } from "../../bench/soak.ts";
import { KAFKA, NO_KAFKA, sayWhySkipped } from "./brokers.ts";

sayWhySkipped(NO_KAFKA);

const EVENTS = Number(process.env.IDEM_KAFKA_SOAK_EVENTS ?? 200_000);

describe.skipIf(NO_KAFKA !== undefined)("Kafka soak: bounded memory", () => {
  it(`${EVENTS.toLocaleString("en")} events applied once each and in order, the heap growing under 100 B per event`, async () => {
    const r = await soakMessaging(kafkaSoak(KAFKA!), {
      events: EVENTS,
      sampleEvery: Math.max(1_000, Math.round(EVENTS / 20)),
      aggregates: 100,
    });
    const perEvent = growthPerItem(r);
    console.log(
      `Kafka: ${EVENTS} events in ${r.seconds.toFixed(1)} s, heap ${r.samples[0]!.heapMB.toFixed(1)} -> ${r.samples.at(-1)!.heapMB.toFixed(1)} MB, ${perEvent.toFixed(1)} B per event`,
    );
    expect(r.check).toEqual({ total: EVENTS, distinct: EVENTS, outOfOrder: 0 });
    expect(perEvent).toBeLessThan(100);
  }, 1_800_000);
});
