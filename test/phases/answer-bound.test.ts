/**
 * The answer bound (issue 14, CONTRACT.md): a request whose external call is still running when the
 * bound is reached is answered 409 in-flight with Retry-After, while the phase goes on in the
 * background holding (and renewing) its lease; the retry then replays what it ended in.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isKeyInFlightError, type KeyInFlightError } from "../../src/core/index.ts";
import { MAX_IN_FLIGHT_RETRY_AFTER_S } from "../../src/postgres/phases/index.ts";
import {
  claimOf,
  deferred,
  LEASE_MS,
  openWorld,
  serverOrEmbedded,
  sleep,
  text,
  type World,
} from "./helpers.ts";

const PAY = { amount_cents: 640, currency: "eur" };

describe.each(serverOrEmbedded)("answer bound on $name", (backend) => {
  let w: World;
  beforeAll(async () => {
    w = await openWorld(backend);
  });
  afterAll(async () => {
    await w?.close();
  });

  it("answers 409 at the bound while the slow call goes on, then the retry replays its result", async () => {
    const key = "slow-provider";
    const c = claimOf("acct", key, PAY);
    const go = deferred();
    const entered = deferred();
    const runner = w.runner({
      heartbeatMs: 20,
      beforeCharge: async () => {
        entered.resolve();
        await go.promise;
      },
    });
    const started = Date.now();
    const early = (await runner.run(c, PAY, { answerWithinMs: 300 }).catch((e) => e)) as KeyInFlightError;
    expect(isKeyInFlightError(early)).toBe(true);
    expect(early.retryAfterSeconds).toBeGreaterThanOrEqual(1);
    expect(early.retryAfterSeconds).toBeLessThanOrEqual(MAX_IN_FLIGHT_RETRY_AFTER_S);
    expect(Date.now() - started).toBeGreaterThanOrEqual(250);
    await entered.promise;

    // The background phase keeps its lease alive past the lease length (heartbeat, store clock moved).
    w.now.ms += LEASE_MS + 1_000;
    await sleep(150);
    const dup = await w
      .runner()
      .run(c, PAY, { answerWithinMs: 300 })
      .catch((e) => e);
    expect(isKeyInFlightError(dup)).toBe(true);

    go.resolve();
    let out: Awaited<ReturnType<typeof runner.run>> | undefined;
    for (let i = 0; i < 100 && !out; i++) {
      out = await w
        .runner()
        .run(c, PAY)
        .catch((e) => {
          if (!isKeyInFlightError(e)) throw e;
          return undefined;
        });
      if (!out) await sleep(50);
    }
    expect(out?.kind).toBe("replayed");
    expect(out?.response.status).toBe(201);
    expect(JSON.parse(text(out!.response))).toMatchObject({ amount_cents: 640 });
    expect(await w.counts(key)).toMatchObject({ charges: 1, payments: 1, receipts: 1 });
  });

  it("a fast request is answered normally under the bound, and the default bound is 5 s", async () => {
    const runner = w.runner({ answerWithinMs: 5_000 });
    const out = await runner.run(claimOf("acct", "fast", PAY), PAY);
    expect(out).toMatchObject({ kind: "executed", saved: true });
    expect(w.runner({}).answerWithinMs).toBe(Number.POSITIVE_INFINITY); // the test helper's own default
    const { definePhases } = await import("../../src/postgres/phases/index.ts");
    expect(
      definePhases({ store: w.store, name: "x", phases: { a: { local: async () => undefined } } })
        .answerWithinMs,
    ).toBe(5_000);
  });
});
