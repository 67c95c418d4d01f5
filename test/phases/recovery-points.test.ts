/**
 * The recovery point an external phase reaches stays recorded whatever its local phase then does: a
 * pipelining driver commits it on its own, ahead of the local phase's transaction and in the same
 * write, and the local phase's statements leave with that transaction's BEGIN and fence. A failing local
 * phase must still leave the call's result behind, so that the retry never calls again.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isLeaseLostError, sqlStateOf } from "../../src/core/index.ts";
import { definePhases, jsonResponse } from "../../src/postgres/phases/index.ts";
import { claimOf, openWorld, serverOrEmbedded, type World } from "./helpers.ts";

const PAY = { amount_cents: 300, currency: "eur" };

describe.each(serverOrEmbedded)("recovery points before a local phase on $name", (backend) => {
  let w: World;
  beforeAll(async () => {
    w = await openWorld(backend);
  });
  afterAll(async () => {
    await w?.close();
  });

  /** A call that counts itself, then a local phase that writes a payment and fails as told. */
  function runner(fail: { local?: "throw" | "bad-statement" }) {
    const calls = { n: 0 };
    const phases = definePhases<typeof PAY, { ref: string }>({
      store: w.store,
      name: "recovery-points",
      answerWithinMs: Number.POSITIVE_INFINITY,
      phases: {
        call: {
          external: async () => {
            calls.n++;
            return { data: { ref: `ref-${calls.n}` } };
          },
          next: "write",
        },
        write: {
          local: async (ctx, tx) => {
            if (fail.local === "bad-statement") await tx.query("INSERT INTO no_such_table VALUES (1)");
            await tx.query(
              "INSERT INTO payments (charge_id, scope, key, amount_cents) VALUES ($1, $2, $3, $4)",
              [ctx.data.ref, ctx.scope, ctx.key, ctx.input.amount_cents],
            );
            if (fail.local === "throw") throw new Error("the local phase failed");
            return { response: jsonResponse(201, { ref: ctx.data.ref }) };
          },
        },
      },
    });
    return { phases, calls };
  }

  const payments = async (key: string) =>
    (
      await w.db.query<{ charge_id: string }>("SELECT charge_id FROM payments WHERE key = $1", [key])
    ).rows.map((r) => r.charge_id);

  it("a local phase that throws: its rows roll back, the call stays recorded, the retry does not call again", async () => {
    const key = "local-throws";
    const c = claimOf("acct", key, PAY);
    const failing = runner({ local: "throw" });
    await expect(failing.phases.run(c, PAY)).rejects.toThrow("the local phase failed");
    expect(failing.calls.n).toBe(1);
    expect(await w.point("acct", key)).toBe("write");
    expect((await w.lease("acct", key)).lease_token).toBeNull(); // freed: the retry runs at once
    expect(await payments(key)).toEqual([]);

    const retry = runner({});
    const out = await retry.phases.run(c, PAY);
    expect([out.kind, out.response.status]).toEqual(["executed", 201]);
    expect(retry.calls.n).toBe(0);
    expect(await payments(key)).toEqual(["ref-1"]);
    expect((await retry.phases.run(c, PAY)).kind).toBe("replayed");
  });

  it("a local phase whose first statement fails: that error, not a lost lease, and the call stays recorded", async () => {
    const key = "local-bad-statement";
    const c = claimOf("acct", key, PAY);
    const failing = runner({ local: "bad-statement" });
    const err = await failing.phases.run(c, PAY).catch((e) => e);
    expect(isLeaseLostError(err)).toBe(false);
    expect(sqlStateOf(err)).toBe("42P01"); // undefined_table
    expect(await w.point("acct", key)).toBe("write");
    expect(await payments(key)).toEqual([]);

    const retry = runner({});
    expect((await retry.phases.run(c, PAY)).response.status).toBe(201);
    expect(retry.calls.n).toBe(0);
    expect(await payments(key)).toEqual(["ref-1"]);
  });
});
