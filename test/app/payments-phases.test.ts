/** The service as `npm start` runs it: payments charged at the provider simulator over HTTP. */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { backends } from "../helpers/db.ts";
import { pay, type RunningService, startService } from "./service.ts";

const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;

describe(`payments through the provider (phases mode) on ${backend.name}`, () => {
  let svc: RunningService;
  beforeAll(async () => {
    svc = await startService(backend, { paymentsMode: "phases" });
  });
  afterAll(async () => {
    await svc?.stop();
  });

  const receipts = () =>
    svc.count("SELECT count(*)::int AS n FROM idem.outbox WHERE topic = 'receipt-email'");

  it("charges once, replays the same bytes, and writes one receipt-email outbox row", async () => {
    const [r0, p0] = [await receipts(), await svc.count("SELECT count(*)::int AS n FROM payments")];
    const key = randomUUID();
    const first = await pay(svc.url, { key });
    const again = await pay(svc.url, { key });
    expect(first.status).toBe(201);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(await again.text()).toBe(await first.text());
    expect((await receipts()) - r0).toBe(1);
    expect((await svc.count("SELECT count(*)::int AS n FROM payments")) - p0).toBe(1);
    const row = await svc.open.db.query<{ recovery_point: string }>(
      "SELECT recovery_point FROM idem.keys WHERE key = $1 AND NOT marker",
      [key],
    );
    expect(row.rows).toEqual([{ recovery_point: "done" }]);
  });

  it("answers a declined card with 402, replays it, and sends no receipt", async () => {
    const r0 = await receipts();
    const key = randomUUID();
    const body = JSON.stringify({ amount_cents: 5000, currency: "eur", card: "4000000000000002" });
    const first = await pay(svc.url, { key, body });
    const again = await pay(svc.url, { key, body });
    expect([first.status, again.status]).toEqual([402, 402]);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(await again.text()).toBe(await first.text());
    expect((await receipts()) - r0).toBe(0);
  });
});
