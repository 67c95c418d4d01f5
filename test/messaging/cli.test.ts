/** `idem relay`, called as the dispatcher calls it. */
import amqp from "amqplib";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { relayCommand } from "../../src/cli/relay.ts";
import { CliError } from "../../src/cli/shared.ts";
import { serverBackends } from "../helpers/db.ts";
import { AMQP_URL, prepare, unique, writeCredits } from "./helpers.ts";

const saved = { ...process.env };
beforeEach(() => {
  delete process.env.AMQP_URL;
  delete process.env.NATS_URL;
  delete process.env.WEBHOOK_URL;
  delete process.env.WEBHOOK_SECRET;
});
afterEach(() => {
  process.env = { ...saved };
  vi.restoreAllMocks();
});

const backend = serverBackends.find((b) => b.name === "pg");

describe("idem relay", () => {
  it("prints its usage with exit 0", async () => {
    const log = vi.spyOn(console, "log").mockImplementation(() => {});
    expect(await relayCommand(["--help"])).toBe(0);
    expect(String(log.mock.calls[0]![0])).toContain("usage: idem relay");
  });

  it("refuses bad options and a missing broker with exit 2 and a one-line fix", async () => {
    for (const argv of [
      ["--batch-size", "0"],
      ["--amqp", "amqp://x", "--nats", "nats://y"],
      ["--bogus"],
      ["--amqp", "amqp://x", "--pipeline"], // without --ordered
      ["--webhook", "http://x", "--ordered", "--pipeline"], // a webhook keeps no order
    ]) {
      const err = await relayCommand(argv).catch((e) => e);
      expect(err).toBeInstanceOf(CliError);
      expect(err.exitCode).toBe(2);
    }
  });

  it.skipIf(!backend)(
    "says which setting is missing: a broker URL (exit 2), then the migrations (exit 1)",
    async () => {
      const { url, close } = await backend!.open();
      try {
        const noBroker = await relayCommand(["--database-url", url!]).catch((e) => e);
        expect(noBroker).toBeInstanceOf(CliError);
        expect(noBroker.exitCode).toBe(2);
        expect(noBroker.message).toMatch(/set AMQP_URL, NATS_URL, KAFKA_URL, SQS_URL or WEBHOOK_URL/);
        process.env.AMQP_URL = AMQP_URL;
        const notMigrated = await relayCommand(["--database-url", url!]).catch((e) => e);
        expect(notMigrated.exitCode).toBe(1);
        expect(notMigrated.message).toMatch(/run idem migrate$/);
      } finally {
        await close();
      }
    },
  );

  it.skipIf(!backend)(
    "--once publishes what is pending to RabbitMQ (from AMQP_URL) and exits 0",
    async () => {
      const { db, url, close } = await backend!.open();
      const conn = await amqp.connect(AMQP_URL);
      const ch = await conn.createChannel();
      const queue = unique("idem_cli");
      try {
        await prepare(db);
        await ch.assertQueue(queue, { durable: false });
        await writeCredits(db, 120, queue);
        process.env.AMQP_URL = AMQP_URL;
        const log = vi.spyOn(console, "log").mockImplementation(() => {});
        expect(await relayCommand(["--database-url", url!, "--once", "--batch-size", "50"])).toBe(0);
        expect(String(log.mock.calls.at(-1)![0])).toMatch(/^published 120 event\(s\) to RabbitMQ/);
        expect((await ch.checkQueue(queue)).messageCount).toBe(120);
      } finally {
        await ch.deleteQueue(queue).catch(() => {});
        await conn.close();
        await close();
      }
    },
  );

  it.skipIf(!backend)("--once exits 1 with the fix when the broker cannot be reached", async () => {
    const { db, url, close } = await backend!.open();
    try {
      await prepare(db);
      await writeCredits(db, 1, "q");
      const err = await relayCommand([
        "--database-url",
        url!,
        "--once",
        "--amqp",
        "amqp://guest:guest@127.0.0.1:1",
      ]).catch((e) => e);
      expect(err).toBeInstanceOf(CliError);
      expect(err.exitCode).toBe(1);
      expect(err.message).toMatch(/cannot reach RabbitMQ .*: start the broker or fix its URL/);
    } finally {
      await close();
    }
  });
});
