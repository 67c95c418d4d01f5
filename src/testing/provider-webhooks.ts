/**
 * The provider simulator's webhooks: each charge sends `charge.pending`, then `charge.succeeded` or
 * `charge.failed`, to a receiver, the way a real provider does: at least once, late, out of order,
 * sometimes twice. Signed as Stripe signs (`Stripe-Signature: t=...,v1=...`, HMAC-SHA256 of
 * `<t>.<body>` under the endpoint secret's UTF-8 bytes), so `stripeScheme` from `idem/webhooks` checks it.
 *
 *   event: {"id": "evt_...", "object": "event", "type": "charge.succeeded", "created": <Unix s>,
 *           "data": {"object": {<the charge>, "status": "succeeded", "version": 2}}}
 *
 * `version` grows with every change of a charge (1 pending, 2 final): the receiver keeps the newest
 * state whatever order the events arrive in. Every delivery is retried until the receiver answers
 * 2xx (backoff, at most `maxAttempts`); then, at `duplicateRate`, the same event is sent once more.
 */
import { createHmac, randomInt } from "node:crypto";
import { bulkhead } from "cockatiel";
import { createRng } from "./prng.ts";

/** Options of the simulator's webhooks (`startProvider({ webhooks })`). `url` and `secret` are required. */
export interface ProviderWebhookOptions {
  /** Where events are POSTed; a function when the receiver's port is known later (undefined: hold). */
  url: string | (() => string | undefined);
  /** The endpoint's signing secret, `whsec_...` (Stripe's scheme). */
  secret: string;
  /** Each event's first delivery waits a random `[min, max]` ms (so events overtake each other). Default [0, 50]. */
  delayMs?: readonly [number, number];
  /** Probability that a charge's final event is sent before its pending one. Default 0.3. */
  reorderRate?: number;
  /** Probability that an event delivered once is delivered again. Default 0.2. */
  duplicateRate?: number;
  /** Deliveries of one event before the simulator gives up on it. Default 12. */
  maxAttempts?: number;
  /**
   * HTTP deliveries in flight at once; later ones wait their turn, as a provider's delivery workers
   * do. Default 8. Without a bound a receiver that falls behind is sent more and more at once, and the
   * requests pile up in both processes.
   */
  concurrency?: number;
  /** Seed of the delays, duplicates and reorderings. Default: random. */
  seed?: number;
}

/** What the simulator's webhooks have done so far. */
export interface ProviderWebhookStats {
  /** Events made (two per charge). */
  events: number;
  /** HTTP deliveries sent, retries and duplicates included. */
  deliveries: number;
  /** Deliveries answered 2xx. */
  acknowledged: number;
  /** Deliveries that failed (a non-2xx answer, a network error); each is retried. */
  failed: number;
  /** Events sent again after they were acknowledged. */
  duplicates: number;
  /** Events the simulator gave up on after `maxAttempts`. */
  abandoned: number;
}

/** The simulator's webhook sender (`provider.webhooks`). */
export interface ProviderWebhooks {
  /** What it has done so far. */
  stats(): ProviderWebhookStats;
  /** Resolves once every event made so far is acknowledged (or abandoned), duplicates included. */
  idle(): Promise<void>;
}

/** The part of a charge the events carry (the simulator's `Charge`). */
export interface ChargeState {
  readonly id: string;
  readonly status: string;
}

/** The sender as the simulator drives it. */
export interface WebhookSender extends ProviderWebhooks {
  /** A charge was made: send its pending and its final event. */
  chargeMade(charge: ChargeState): void;
  /** Stop sending (deliveries in flight are abandoned). */
  close(): void;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Start sending webhooks for the charges the simulator makes. */
export function startWebhookSender(options: ProviderWebhookOptions): WebhookSender {
  if (!options.secret) throw new TypeError("the simulator's webhooks need a secret");
  const rng = createRng(options.seed ?? randomInt(1, 2 ** 31));
  const [minDelay, maxDelay] = options.delayMs ?? [0, 50];
  const maxAttempts = options.maxAttempts ?? 12;
  const stats: ProviderWebhookStats = {
    events: 0,
    deliveries: 0,
    acknowledged: 0,
    failed: 0,
    duplicates: 0,
    abandoned: 0,
  };
  const pending = new Set<Promise<void>>();
  let closed = false;
  // The delivery slots (cockatiel's bulkhead, as the client uses cockatiel): `concurrency` posts run,
  // the others wait their turn, first come first served.
  const slots = bulkhead(Math.max(1, options.concurrency ?? 8), Number.POSITIVE_INFINITY);

  const urlOf = () => (typeof options.url === "function" ? options.url() : options.url);
  const delay = () => minDelay + rng.int(Math.max(0, maxDelay - minDelay) + 1);

  async function post(body: string): Promise<boolean> {
    let url = urlOf();
    while (url === undefined && !closed) {
      await sleep(20);
      url = urlOf();
    }
    if (closed || url === undefined) return false;
    return slots.execute(() => (closed ? false : send(url, body)));
  }

  async function send(url: string, body: string): Promise<boolean> {
    const t = Math.floor(Date.now() / 1000);
    const v1 = createHmac("sha256", options.secret).update(`${t}.${body}`).digest("hex");
    stats.deliveries++;
    try {
      const res = await fetch(url, {
        method: "POST",
        headers: { "content-type": "application/json", "stripe-signature": `t=${t},v1=${v1}` },
        body,
        signal: AbortSignal.timeout(10_000),
      });
      await res.body?.cancel().catch(() => {});
      if (res.ok) stats.acknowledged++;
      else stats.failed++;
      return res.ok;
    } catch {
      stats.failed++;
      return false;
    }
  }

  async function deliver(body: string, waitMs: number): Promise<void> {
    await sleep(waitMs);
    for (let attempt = 1; !closed; attempt++) {
      if (await post(body)) break;
      if (attempt >= maxAttempts) {
        stats.abandoned++;
        return;
      }
      await sleep(Math.min(2_000, 25 * 2 ** attempt) * (0.5 + rng.next() / 2));
    }
    if (!closed && rng.chance(options.duplicateRate ?? 0.2)) {
      stats.duplicates++;
      await sleep(delay());
      await post(body);
    }
  }

  function track(p: Promise<void>): void {
    pending.add(p);
    p.finally(() => pending.delete(p));
  }

  function event(charge: ChargeState, type: string, status: string, version: number): string {
    stats.events++;
    return JSON.stringify({
      id: `evt_${rng.hex(24)}`,
      object: "event",
      type,
      created: Math.floor(Date.now() / 1000),
      data: { object: { ...charge, status, version } },
    });
  }

  return {
    chargeMade(charge) {
      const first = event(charge, "charge.pending", "pending", 1);
      const last = event(charge, `charge.${charge.status}`, charge.status, 2);
      const [a, b] = [delay(), delay()].sort((x, y) => x - y) as [number, number];
      // Usually the pending event leaves first; sometimes the final one overtakes it on purpose.
      const reorder = rng.chance(options.reorderRate ?? 0.3);
      track(deliver(first, reorder ? b + 5 : a));
      track(deliver(last, reorder ? a : b));
    },
    stats: () => ({ ...stats }),
    async idle() {
      while (pending.size > 0) await Promise.all([...pending]);
    },
    close() {
      closed = true;
    },
  };
}
