/** The provider simulator's refunds and charges report, as a reconciliation job meets them. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Provider, startProvider } from "../../src/testing/provider.ts";
import { chargeProvider } from "../../src/testing/provider-client.ts";

describe("the simulator's refunds and report", () => {
  let p: Provider;
  let clock = Date.parse("2026-12-01T10:00:00Z");
  beforeAll(async () => {
    p = await startProvider({ clock: () => clock, seed: 3 });
  });
  afterAll(() => p?.close());

  const refund = (body: string, key: string, type = "application/x-www-form-urlencoded") =>
    fetch(`${p.url}/v1/refunds`, {
      method: "POST",
      headers: { "content-type": type, "idempotency-key": key },
      body,
    });

  it("refunds once per key, never more than the charge holds, and says why not", async () => {
    const r = await chargeProvider(p.url, {
      amount: 1_000,
      currency: "eur",
      idempotencyKey: "c1",
      reference: "a:1",
    });
    const id = r.kind === "charged" ? r.charge.id : "";
    const first = await refund(`charge=${id}&amount=600`, "r1");
    expect(first.status).toBe(200);
    const again = await refund(`charge=${id}&amount=600`, "r1");
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(await again.json()).toEqual(await first.json());
    expect((await refund(`charge=${id}&amount=500`, "r2")).status).toBe(400); // only 400 left
    expect(((await (await refund(`charge=${id}&amount=500`, "r2b")).json()) as any).error.code).toBe(
      "amount_too_large",
    );
    expect((await refund(`charge=${id}&amount=100`, "r1")).status).toBe(422); // the key, other parameters
    expect((await refund(JSON.stringify({ charge: "ch_nope" }), "r3", "application/json")).status).toBe(404);
    const rest = await refund(JSON.stringify({ charge: id }), "r4", "application/json"); // whatever is left
    expect(await rest.json()).toMatchObject({ amount: 400, charge: id });
    expect(p.refunds().map((x) => x.amount)).toEqual([600, 400]);
  });

  it("exports [from, to) as CSV in major units or JSON in minor units, with what was refunded", async () => {
    clock = Date.parse("2026-12-01T11:00:00Z");
    await chargeProvider(p.url, { amount: 250, currency: "jpy", idempotencyKey: "c2", reference: 'b,"2"' });
    const q = "from=2026-12-01T11:00:00Z&to=2026-12-01T12:00:00Z";
    const csv = await (await fetch(`${p.url}/v1/reports/charges?${q}`)).text();
    expect(csv.trim().split("\n")).toEqual([
      "id,created_utc,gross,currency,status,amount_refunded,reference,idempotency_key",
      expect.stringMatching(/^ch_\w+,2026-12-01T11:00:00.000Z,250,jpy,succeeded,0,"b,""2""",c2$/),
    ]);
    const all = (await (await fetch(`${p.url}/v1/reports/charges?format=json`)).json()) as { data: any[] };
    expect(all.data.map((l) => [l.amount, l.amount_refunded])).toEqual([
      [1_000, 1_000],
      [250, 0],
    ]);
    expect((await fetch(`${p.url}/v1/reports/charges?from=yesterday`)).status).toBe(400);
  });
});
