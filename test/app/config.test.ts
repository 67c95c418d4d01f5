import { describe, expect, it } from "vitest";
import { loadConfig } from "../../app/config.ts";

describe("the service's configuration: every variable read and checked in one place", () => {
  it("has the documented defaults with an empty environment", () => {
    const c = loadConfig({});
    expect(c).toMatchObject({
      port: 3000,
      host: "127.0.0.1",
      metricsPort: undefined,
      retentionMs: 24 * 3_600_000,
      paymentsMode: "phases",
      provider: { url: undefined, port: 4100, retentionMs: undefined, idempotency: true },
      sealer: undefined,
      requireKey: true,
      demo: false,
      regions: undefined,
      receipts: {},
    });
    expect(c.limits).toMatchObject({ headersTimeoutMs: 10_000, requestTimeoutMs: 15_000, drainMs: 10_000 });
  });

  it("reads each setting", () => {
    const c = loadConfig({
      PORT: "0",
      IDEM_POOL_SIZE: "7",
      IDEM_DB_DRIVER: "postgres",
      IDEM_PAYMENTS_MODE: "atomic",
      PROVIDER_IDEMPOTENCY: "false",
      PROVIDER_RETENTION_MS: "60000",
      IDEM_DRAIN_MS: "250",
      IDEM_OPTIONAL_KEY: "1",
      NATS_URL: "nats://127.0.0.1:4222",
      IDEM_REGION: "eu",
      IDEM_REGION_URLS: "eu=http://127.0.0.1:3001",
    });
    expect(c.port).toBe(0);
    expect(c.database).toMatchObject({ poolSize: 7, driver: "postgres" });
    expect(c.paymentsMode).toBe("atomic");
    expect(c.provider).toMatchObject({ idempotency: false, retentionMs: 60_000 });
    expect(c.limits.drainMs).toBe(250);
    expect(c.requireKey).toBe(false);
    expect(c.receipts).toEqual({ natsUrl: "nats://127.0.0.1:4222" });
    expect(c.regions).toEqual({ region: "eu", urls: { eu: "http://127.0.0.1:3001" }, homes: {} });
  });

  it.each([
    ["PORT", "70000"],
    ["PROVIDER_PORT", "x"],
    ["IDEM_POOL_SIZE", "0"],
    ["PROVIDER_RETENTION_MS", "1.5"],
    ["IDEM_HTTP_MAX_CONNECTIONS", "-1"],
    ["IDEM_RETENTION_HOURS", "0"],
    ["IDEM_PAYMENTS_MODE", "eventually"],
    ["IDEM_DB_DRIVER", "mysql"],
    ["PROVIDER_IDEMPOTENCY", "maybe"],
  ])("a bad %s (%s) stops start-up naming it", (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrow(name);
  });
});
