/**
 * The retry-storm calculator's live mode (the playground's storm panel): real `idem/client` layers in
 * front of the real service, measured.
 *
 *   POST /playground/api/storm  {"attempts": [3, 3, 3], "failure": 0.5, "budget": 0.1, "taps": 40}
 *
 * Each tap is one payment (1 cent, as the demo account) sent by the top layer's client. Each layer is a
 * hop with a client of its own (`attempts[i]` attempts, backoff of a few ms, no breaker) that forwards
 * the caller's Idempotency-Key and answers with what its client got, or `passUp(error)`: a layer that
 * makes one attempt fails fast and passes the error up. Under the last layer is the bottom: a gate that
 * fails each call with probability `failure` (503, like a database that is down) and otherwise hands
 * it to the service's payments route, in process, through every middleware. The run is made twice,
 * without a retry budget and with one at every layer (ratio `budget`, a bucket of one token, so that a
 * short run shows the steady state), and reports what the bottom received per tap, how many taps failed,
 * and how many payments the taps made (one per tap that succeeded, whatever the retries).
 */
import { randomBytes } from "node:crypto";
import { Hono } from "hono";
import { createClient, passUp, RetryBudget } from "idem/client";
import type { Db } from "idem/postgres";
import { DEMO_ACCOUNTS } from "./accounts.ts";
import { problem } from "./problems.ts";
import { type StormInput, StormRequest } from "./schemas.ts";
import { validBody } from "./validate.ts";

type Env = { Variables: { body: StormInput } };

/** The most calls one live run may send to the bottom in its worst case. */
const MAX_CALLS = 20_000;

/** What one run (with or without the budget) measured. */
export interface StormRun {
  taps: number;
  /** Calls that reached the bottom (the gate), failed or not. */
  bottomCalls: number;
  loadPerTap: number;
  /** Taps whose top-level call did not end in a payment. */
  failedTaps: number;
  failures: number;
  /** Payments the taps made (the service's rows): one per tap that succeeded. */
  payments: number;
}

export function stormRoutes(o: {
  db: Db;
  service: (request: Request) => Response | Promise<Response>;
}): Hono<Env> {
  const app = new Hono<Env>();
  const account = DEMO_ACCOUNTS[0];
  app.post("/playground/api/storm", validBody(StormRequest, { what: "storm" }), async (c) => {
    const { attempts, failure, budget, taps } = c.var.body;
    // The worst case (every call failing, no budget) is taps x the product of the attempts: keep a run
    // something the demo service can take.
    const worst = taps * attempts.reduce((a, b) => a * b, 1);
    if (worst > MAX_CALLS) {
      return problem(
        400,
        "storm-too-large",
        `Up to ${worst} calls could reach the bottom (taps x attempts per layer); at most ${MAX_CALLS}: fewer taps or attempts.`,
      );
    }
    const run = async (withBudget: boolean): Promise<StormRun> => {
      const tag = `storm-${randomBytes(4).toString("hex")}`;
      let bottomCalls = 0;
      // The bottom: fails with probability `failure`, otherwise the real payments route.
      let next = async (req: Request): Promise<Response> => {
        bottomCalls++;
        if (Math.random() < failure) return new Response("the database is down", { status: 503 });
        return o.service(
          new Request("http://playground.internal/v1/payments", {
            method: "POST",
            headers: {
              authorization: `Bearer ${account.apiKey}`,
              "content-type": "application/json",
              "idempotency-key": req.headers.get("idempotency-key") ?? "",
            },
            body: JSON.stringify({ amount_cents: 1, currency: "eur" }),
          }),
        );
      };
      // The layers, from the bottom up: each a client over the hop below.
      for (const n of [...attempts].reverse()) {
        const below = next;
        const client = createClient({
          fetch: (url, init) => below(new Request(url, init)),
          maxAttempts: n,
          retry: { baseMs: 2, capMs: 20 },
          failFast: n === 1,
          budget: withBudget ? new RetryBudget({ ratio: budget, cap: 1 }) : false,
          breaker: false,
          deadlineMs: 60_000,
          operationsPath: false,
        });
        next = async (req) => {
          const key = req.headers.get("idempotency-key") ?? "";
          try {
            const intent = await client.intent(undefined, { key });
            return await client.request(intent, "http://layer.internal/pay", { method: "POST", body: "{}" });
          } catch (err) {
            return passUp(err, { retryAfterSeconds: 0 });
          }
        };
      }
      let failedTaps = 0;
      const keys = Array.from({ length: taps }, (_, i) => `${tag}-${i}`);
      const queue = [...keys];
      const worker = async () => {
        for (let key = queue.shift(); key !== undefined; key = queue.shift()) {
          const res = await next(
            new Request("http://app.internal/pay", { method: "POST", headers: { "idempotency-key": key } }),
          );
          await res.body?.cancel();
          if (res.status !== 201) failedTaps++;
        }
      };
      await Promise.all(Array.from({ length: 8 }, worker));
      const { rows } = await o.db.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM payments WHERE account_id = $1 AND idempotency_key LIKE $2",
        [account.id, `${tag}-%`],
      );
      return {
        taps,
        bottomCalls,
        loadPerTap: bottomCalls / taps,
        failedTaps,
        failures: failedTaps / taps,
        payments: Number(rows[0]?.n ?? 0),
      };
    };
    const without = await run(false);
    const withBudget = await run(true);
    return c.json({ attempts, failure, budget, taps, withoutBudget: without, withBudget });
  });
  return app;
}
