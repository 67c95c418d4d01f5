/** What the runtimes' app adds to the contract (app.ts): writeOutbox in a keyed route, and idem's client. */
import { randomUUID } from "node:crypto";
import { expect, it } from "vitest";
import { type AppUnderTest, account } from "../http/contract.ts";

export function appExtrasContract(app: AppUnderTest): void {
  it("writes one outbox event for a keyed request and its replay (writeOutbox in the route's transaction)", async () => {
    await app.db.exec("SELECT 1"); // the app's database, migrated by useApp
    const acct = account();
    const key = randomUUID();
    const first = await app.post("/v1/orders", { account: acct, key, body: { sku: "a" } });
    const again = await app.post("/v1/orders", { account: acct, key, body: { sku: "a" } });
    expect(first.status).toBe(201);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    const { event } = (await first.json()) as { event: string };
    expect(await again.json()).toEqual({ event });
    const { rows } = await app.db.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM idem.outbox WHERE payload->>'scope' = $1",
      [acct],
    );
    expect(rows[0]!.n).toBe(1);
  });

  it("runs idem's client in the runtime: one intent, one payment, the retry replayed", async () => {
    const acct = account();
    const call = async () =>
      (await (
        await fetch(`${app.url}/_client`, {
          method: "POST",
          body: JSON.stringify({
            url: `${app.url}/v1/payments`,
            body: { amount_cents: 700, currency: "eur" },
            intent: `pay-${acct}`,
            headers: { "x-account": acct },
          }),
        })
      ).json()) as { status: number; replayed: string | null; body: string };
    const first = await call();
    const second = await call();
    expect(first.status).toBe(201);
    expect(second).toEqual({ ...first, replayed: "true" });
    expect(await app.rows(acct)).toBe(1);
  });
}
