import { describe, expect, it } from "vitest";
import { loadConfig, providerUrlOf } from "../../app/config.ts";
import { DECLINED_TEST_CARD, providerCard } from "../../app/payments-phases.ts";

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
      cardTokenKey: undefined,
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
    ["IDEM_CARD_TOKEN_KEY", "short-secret"],
    ["IDEM_ADMIN_TOKEN", "x"],
    ["IDEM_ADMIN_TOKEN", "alice:token-of-alice"],
    ["IDEM_ADMIN_TOKEN", "alice:Hq7vX2mR9pL4sK8wZ3nT6yB1,bob:0123456789abcdef"],
  ])("a bad %s (%s) stops start-up naming it", (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrow(name);
  });

  it("IDEM_CARD_TOKEN_KEY: instances with the same key give a card the same token, never the number", () => {
    const key = "k".repeat(32);
    const { cardTokenKey } = loadConfig({ IDEM_CARD_TOKEN_KEY: key });
    expect(cardTokenKey).toBe(key);
    const card = "4242424242424242";
    const token = providerCard(card, cardTokenKey);
    expect(token).toMatch(/^tok_[0-9a-f]{24}$/);
    expect(providerCard(card, key)).toBe(token); // another instance, same key
    expect(providerCard(card, "j".repeat(32))).not.toBe(token);
    expect(providerCard(DECLINED_TEST_CARD, key)).toBe(DECLINED_TEST_CARD);
  });

  it("the provider's URL: PROVIDER_URL, else the in-process simulator's port (as the completer finds it)", () => {
    expect(providerUrlOf(loadConfig({}))).toBe("http://127.0.0.1:4100");
    expect(providerUrlOf(loadConfig({ PROVIDER_PORT: "4101" }))).toBe("http://127.0.0.1:4101");
    expect(providerUrlOf(loadConfig({ PROVIDER_URL: "http://pay.internal:8080" }))).toBe(
      "http://pay.internal:8080",
    );
  });
});
