/**
 * Retention shorter than a retry: after the key expired, the same key is a new payment. The provider
 * still remembers the old downstream key, so the runner must name the new claim (not `scope:key`), or
 * the provider would answer with the old charge and the service would record a second payment backed by
 * it (it crashed on the payment's primary key: 500). Now: a new charge, a new payment, 201. In both
 * provider modes.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { backends } from "../helpers/db.ts";
import { pay, type RunningService, startService } from "./service.ts";

const RETENTION_MS = 1_500;

describe.each(
  backends.slice(-1).flatMap((backend) => [
    { backend, idempotency: true, name: `${backend.name}, provider dedups by key` },
    { backend, idempotency: false, name: `${backend.name}, lookup mode` },
  ]),
)("a key reused after its retention, $name", ({ backend, idempotency }) => {
  let svc: RunningService;
  beforeAll(async () => {
    svc = await startService(backend, {
      paymentsMode: "phases",
      providerIdempotency: idempotency,
      retentionMs: RETENTION_MS,
    });
  });
  afterAll(async () => {
    await svc?.stop();
  });

  it("is a new payment with its own new charge: 201, never a 500 or a payment without its charge", async () => {
    const key = randomUUID();
    const first = await pay(svc.url, { key });
    expect(first.status).toBe(201);
    const a = await first.json();
    const replay = await pay(svc.url, { key });
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    await new Promise((r) => setTimeout(r, RETENTION_MS + 300)); // the key expires
    const again = await pay(svc.url, { key });
    expect(again.status).toBe(201);
    expect(again.headers.get("idempotent-replayed")).toBeNull();
    const b = await again.json();
    expect(b.id).not.toBe(a.id);
    expect(b.charge).not.toBe(a.charge);
    const charges = svc.provider!.charges().filter((c) => c.status === "succeeded");
    expect(charges.map((c) => c.id)).toEqual(expect.arrayContaining([a.charge, b.charge]));
    // Each payment backed by its own charge.
    expect(
      await svc.count("SELECT count(*)::int AS n FROM payments WHERE id = ANY($1)", [[a.id, b.id]]),
    ).toBe(2);
  });
});
