/**
 * Every problem answer carries the contract's next-step fields (operation_state, retry_same_key,
 * safe_new_key) and the Idempotency-Operation-State header, with values that are true: a request
 * refused before anything ran says a new key is safe; a failure whose outcome is unknown never does.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HomeRegionRouter } from "../../src/http/home-region.ts";
import { backends } from "../helpers/db.ts";
import { KEY_1, pay, type RunningService, startService } from "./service.ts";

async function fields(res: Response) {
  const body = await res.json();
  return {
    status: res.status,
    header: res.headers.get("idempotency-operation-state"),
    operation_state: body.operation_state,
    retry_same_key: body.retry_same_key,
    safe_new_key: body.safe_new_key,
  };
}

const NOTHING_DONE = { operation_state: "none", retry_same_key: false, safe_new_key: true, header: "none" };

describe.each(backends.slice(0, 1))("next-step fields on every problem, $name", (backend) => {
  let svc: RunningService;
  beforeAll(async () => {
    svc = await startService(backend, { paymentsMode: "phases" });
  });
  afterAll(async () => {
    await svc?.stop();
  });

  it("validation 400, 415 and 413, and 401: nothing was done, a new key is safe", async () => {
    const bad = await pay(svc.url, {
      key: "v1",
      body: JSON.stringify({ amount_cents: -5, currency: "eur" }),
    });
    expect(await fields(bad)).toEqual({ status: 400, ...NOTHING_DONE });
    const media = await pay(svc.url, { key: "v2", contentType: "text/plain", body: "hi" });
    expect(await fields(media)).toEqual({ status: 415, ...NOTHING_DONE });
    const big = await pay(svc.url, { key: "v3", body: JSON.stringify({ pad: "x".repeat(40_000) }) });
    expect(await fields(big)).toEqual({ status: 413, ...NOTHING_DONE });
    const anon = await pay(svc.url, { key: "v4", apiKey: "sk_nobody" });
    expect(await fields(anon)).toEqual({ status: 401, ...NOTHING_DONE });
    const missing = await pay(svc.url, {});
    expect(await fields(missing)).toEqual({ status: 400, ...NOTHING_DONE });
    expect(KEY_1).toBeTruthy();
  });

  it("the home region's 503: refused before sending is retryable and safe; after a timeout never a new key", async () => {
    // A home region that accepts the request and never answers.
    const hang: Server = createServer(() => {});
    await new Promise<void>((r) => hang.listen(0, "127.0.0.1", () => r()));
    const hangUrl = `http://127.0.0.1:${(hang.address() as AddressInfo).port}`;
    const closed = createServer();
    await new Promise<void>((r) => closed.listen(0, "127.0.0.1", () => r()));
    const closedUrl = `http://127.0.0.1:${(closed.address() as AddressInfo).port}`;
    await new Promise<void>((r) => closed.close(() => r()));
    try {
      const router = (target: string) =>
        new HomeRegionRouter({ region: "eu", homeOf: () => "us", targets: { us: target }, timeoutMs: 300 });
      const req = () => new Request("http://eu/v1/payments", { method: "POST", body: "{}" });
      const late = await router(hangUrl).handle(req(), "acct");
      expect(await fields(late!)).toEqual({
        status: 503,
        operation_state: "in_progress",
        retry_same_key: true,
        safe_new_key: false,
        header: "in_progress",
      });
      const refused = await router(closedUrl).handle(req(), "acct");
      expect(await fields(refused!)).toEqual({
        status: 503,
        operation_state: "none",
        retry_same_key: true,
        safe_new_key: true,
        header: "none",
      });
    } finally {
      hang.closeAllConnections();
      await new Promise<void>((r) => hang.close(() => r()));
    }
  });
});
