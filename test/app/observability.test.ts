import { randomUUID } from "node:crypto";
import { Writable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createLogger } from "../../app/observability.ts";
import { backends } from "../helpers/db.ts";
import { pay, type RunningService, startService } from "./service.ts";

const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;

describe("logs and metrics", () => {
  let svc: RunningService;
  const lines: Record<string, unknown>[] = [];
  beforeAll(async () => {
    const sink = new Writable({
      write(chunk, _enc, cb) {
        for (const l of String(chunk).split("\n")) if (l.trim()) lines.push(JSON.parse(l));
        cb();
      },
    });
    svc = await startService(backend, { logger: createLogger({ level: "info", destination: sink }) });
  });
  afterAll(async () => {
    await svc?.stop();
  });

  const metric = async (outcome: string) => {
    const text = await (await fetch(`${svc.url}/metrics`)).text();
    const line = text
      .split("\n")
      .find(
        (l) =>
          l.startsWith("idem_http_requests_total{") &&
          l.includes(`outcome="${outcome}"`) &&
          l.includes('route="/v1/payments"'),
      );
    return line ? Number(line.split(" ").at(-1)) : 0;
  };

  it("writes the request id, the scope and the idempotency key on the request's log line", async () => {
    const key = randomUUID();
    const r = await pay(svc.url, { key, headers: { "x-request-id": "req-abc-1" } });
    expect(r.headers.get("x-request-id")).toBe("req-abc-1");
    const mine = lines.filter((l) => l.req_id === "req-abc-1");
    expect(mine.length).toBeGreaterThan(0);
    for (const l of mine) {
      expect(l).toMatchObject({ idempotency_key: key, scope: "acct_demo_1" });
    }
    expect(mine.at(-1)).toMatchObject({ msg: "request", status: 201, outcome: "executed" });
  });

  it("counts requests by outcome: executed, replayed, mismatch, invalid", async () => {
    const before = {
      executed: await metric("executed"),
      replayed: await metric("replayed"),
      mismatch: await metric("mismatch"),
      invalid: await metric("invalid"),
    };
    const key = randomUUID();
    await pay(svc.url, { key });
    await pay(svc.url, { key });
    await pay(svc.url, { key });
    await pay(svc.url, { key, body: '{"amount_cents":1,"currency":"eur"}' });
    await pay(svc.url, {});
    expect((await metric("executed")) - before.executed).toBe(1);
    expect((await metric("replayed")) - before.replayed).toBe(2);
    expect((await metric("mismatch")) - before.mismatch).toBe(1);
    expect((await metric("invalid")) - before.invalid).toBe(1);
    const text = await (await fetch(`${svc.url}/metrics`)).text();
    expect(text).toContain("idem_http_request_duration_seconds_bucket");
    expect(text).toMatch(/^idem_outbox_lag_seconds \d/m); // read by IdemGauges, a number (NaN if the read failed)
  });

  it("reports health with the database checked", async () => {
    const r = await fetch(`${svc.url}/health`);
    expect(r.status).toBe(200);
    expect(await r.json()).toMatchObject({ status: "ok", database: "ok" });
  });
});
