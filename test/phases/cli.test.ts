/** `idem provider` and `idem complete`, called as the dispatcher calls them. */
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { completeCommand } from "../../src/cli/complete.ts";
import { providerCommand } from "../../src/cli/provider.ts";
import { CliError } from "../../src/cli/shared.ts";
import { SimulatedCrashError } from "../../src/postgres/phases/index.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { crashAt } from "../../src/testing/faults.ts";
import { type Provider, startProvider } from "../../src/testing/provider.ts";
import { chargeProvider } from "../../src/testing/provider-client.ts";
import { type OpenDb, serverBackends } from "../helpers/db.ts";
import { TestTime } from "../helpers/time.ts";
import { claimOf, paymentsRunner } from "./helpers.ts";

const FIXTURE = new URL("./fixtures/runners.ts", import.meta.url).pathname;

describe("idem provider", () => {
  it("serves charges until SIGTERM, then exits 0", async () => {
    const log = vi.spyOn(console, "log").mockImplementation(() => {});
    try {
      const done = providerCommand(["--port", "0", "--seed", "3", "--decline-amounts", "6666"]);
      await vi.waitFor(() => expect(log).toHaveBeenCalled());
      const url = /(http:\/\/\S+)/.exec(String(log.mock.calls[0]![0]))![1]!;
      expect((await chargeProvider(url, { amount: 6666, currency: "eur", idempotencyKey: "k" })).kind).toBe(
        "declined",
      );
      expect((await chargeProvider(url, { amount: 100, currency: "eur", idempotencyKey: "k2" })).kind).toBe(
        "charged",
      );
      process.emit("SIGTERM");
      expect(await done).toBe(0);
    } finally {
      log.mockRestore();
    }
  });

  it("prints help with exit 0 and refuses bad options with exit 2", async () => {
    const log = vi.spyOn(console, "log").mockImplementation(() => {});
    try {
      expect(await providerCommand(["--help"])).toBe(0);
      expect(String(log.mock.calls[0]![0])).toContain("usage: idem provider");
    } finally {
      log.mockRestore();
    }
    const err = await providerCommand(["--error-rate", "2"]).catch((e) => e);
    expect(err).toBeInstanceOf(CliError);
    expect(err.exitCode).toBe(2);
  });
});

describe("idem complete", () => {
  it("requires --module (exit 2) and prints help (exit 0)", async () => {
    const err = await completeCommand([]).catch((e) => e);
    expect(err).toBeInstanceOf(CliError);
    expect(err.exitCode).toBe(2);
    const log = vi.spyOn(console, "log").mockImplementation(() => {});
    try {
      expect(await completeCommand(["--help"])).toBe(0);
    } finally {
      log.mockRestore();
    }
  });
});

describe.each(serverBackends.slice(0, 1))("idem complete on $name", (backend) => {
  let open: OpenDb;
  let provider: Provider;
  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
    await open.db.exec(`CREATE TABLE payments (id serial PRIMARY KEY, charge_id text NOT NULL, scope text NOT NULL,
      key text NOT NULL, amount_cents int NOT NULL)`);
    provider = await startProvider();
  });
  afterAll(async () => {
    await provider?.close();
    await open?.close();
  });

  it("finishes an abandoned payment with the runners of --module", async () => {
    const now = new TestTime(Date.now() - 5 * 60_000); // the crash happened five minutes ago
    const store = await PostgresStore.open(open.db, { timeShift: now });
    const input = { amount_cents: 2500, currency: "eur" };
    const crashing = paymentsRunner(store, provider.url, { faults: crashAt("after-external") });
    await expect(crashing.run(claimOf("acct", "cli-abandoned", input), input)).rejects.toBeInstanceOf(
      SimulatedCrashError,
    );
    now.offsetMs = 0;
    process.env.PROVIDER_URL = provider.url;
    const log = vi.spyOn(console, "log").mockImplementation(() => {});
    let code: number;
    let printed: string;
    try {
      code = await completeCommand(["--module", FIXTURE, "--database-url", open.url!, "--older-than", "60"]);
      printed = log.mock.calls.map((c) => String(c[0])).join("\n");
    } finally {
      log.mockRestore();
    }
    expect(code).toBe(0);
    expect(printed).toContain("completed");
    expect(await store.inspect("acct", "cli-abandoned")).toMatchObject({
      state: "done",
      recoveryPoint: "done",
    });
    expect(provider.charges()).toHaveLength(1);
  });
});
