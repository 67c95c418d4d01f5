/**
 * The TypeScript blocks of README.md and docs/*.md, through scripts/doc-blocks.mjs (the harness a docs
 * build calls too): every block is type-checked against idem's public entry points (or is a verbatim
 * excerpt of an example that is, or is marked with the reason it is not), and the blocks marked to run
 * run as a user runs them. docs/messaging.md's relay, inbox and NATS consumer are whole programs: the
 * test gives them a fresh database (migrated, as `idem migrate` does) and queue and stream names of
 * their own, sees an event go outbox -> relay -> broker -> inbox -> effect, and sends each SIGTERM:
 * one stop() must let the process exit 0.
 */
import { randomBytes } from "node:crypto";
import { jetstreamManager } from "@nats-io/jetstream";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Block, RunResult } from "../../scripts/doc-blocks.mjs";
import * as docs from "../../scripts/doc-blocks.mjs";
import { connectNats, NatsPublisher } from "../../src/messaging/nats.ts";
import { Relay } from "../../src/messaging/relay.ts";
import type { Db } from "../../src/postgres/db.ts";
import { fromPg } from "../../src/postgres/drivers/pg.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { freshDatabase, NO_SERVER } from "../helpers/db.ts";
import { AMQP_URL, NATS_URL } from "../messaging/helpers.ts";

const blocks = docs.typescriptBlocks();

describe("the TypeScript blocks of README.md and docs/*.md", () => {
  it("are each type-checked, an excerpt of a checked example, or marked with the reason they are not", () => {
    expect(docs.defaultDocs()).toContain("docs/messaging.md");
    expect(blocks.length).toBeGreaterThan(40);
    expect(docs.markProblems(blocks)).toEqual([]);
    const skipped = blocks.filter((b) => b.mark?.kind === "not checked");
    expect(skipped.length).toBeLessThan(6);
    expect(blocks.filter((b) => b.mark?.kind === "run").map((b) => b.file)).toEqual([
      "docs/messaging.md",
      "docs/messaging.md",
      "docs/messaging.md",
    ]);
  });

  it("type-check against idem's public entry points, with no error", async () => {
    expect(await docs.typecheckBlocks(blocks)).toEqual([]);
  }, 180_000);
});

/** Why the messaging programs cannot run here, or undefined when they can. */
async function messagingUnavailable(): Promise<string | undefined> {
  if (NO_SERVER) return NO_SERVER;
  const amqp = await import("amqplib");
  const conn = await amqp.connect(AMQP_URL).catch(() => undefined);
  if (!conn) return `needs RabbitMQ at ${AMQP_URL}`;
  await conn.close();
  const nc = await connectNats(NATS_URL, { maxReconnectAttempts: 0 }).catch(() => undefined);
  if (!nc) return `needs NATS JetStream at ${NATS_URL}`;
  await nc.close();
  return undefined;
}
const unavailable = await messagingUnavailable();

describe.skipIf(unavailable !== undefined)("docs/messaging.md's programs, run as written", () => {
  if (unavailable) it.skip(`skipped: ${unavailable}`, () => {});
  const runs = blocks.filter((b) => b.file === "docs/messaging.md" && b.mark?.kind === "run");
  const [relayBlock, inboxBlock, natsBlock] = runs as [Block, Block, Block];
  const own = randomBytes(4).toString("hex");
  const queue = `receipt-email-${own}`;
  const stream = `RECEIPTS_${own}`;
  let fresh: Awaited<ReturnType<typeof freshDatabase>>;
  let pool: pg.Pool;
  let db: Db;
  let env: NodeJS.ProcessEnv;

  beforeAll(async () => {
    fresh = await freshDatabase("docs_messaging");
    pool = new pg.Pool({ connectionString: fresh.url });
    db = fromPg(pool);
    await migrate(db); // what `idem migrate` does before the relay runs
    await db.exec(`
      CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL DEFAULT 'new');
      CREATE TABLE sent_emails (message_id text NOT NULL, order_id text NOT NULL);
    `);
    env = { ...process.env, DATABASE_URL: fresh.url, AMQP_URL, NATS_URL };
  });
  afterAll(async () => {
    const amqp = await import("amqplib");
    const conn = await amqp.connect(AMQP_URL);
    const ch = await conn.createChannel();
    await ch.deleteQueue(queue).catch(() => {});
    await conn.close();
    const nc = await connectNats(NATS_URL);
    await (await jetstreamManager(nc)).streams.delete(stream).catch(() => {});
    await nc.close();
    await db?.close();
    await fresh?.drop();
  });

  /** The event "The outbox" writes: an order paid, for the topic given. */
  async function orderPaid(orderId: string, topic: string): Promise<string> {
    return db.transaction(async (tx) => {
      await tx.query("INSERT INTO orders (id, status) VALUES ($1, 'paid')", [orderId]);
      return writeOutbox(tx, {
        topic,
        type: "order.paid",
        payload: { order: orderId, amount_cents: 4200 },
        aggregateType: "order",
        aggregateId: orderId,
      });
    });
  }
  const count = async (sql: string, params: unknown[]) =>
    Number((await db.query<{ n: string }>(sql, params)).rows[0]?.n);
  const expectExited = (r: RunResult, what: string) =>
    expect(r, `${what}:\n${r.output}`).toMatchObject({ code: 0, killed: false });

  it("the relay publishes the outbox to a queue it declares, and exits on SIGTERM after one stop()", async () => {
    const id = await orderPaid("order-1", queue);
    const result = await docs.runBlock(relayBlock, {
      env,
      timeoutMs: 30_000,
      rewrite: (code) => code.replaceAll('"receipt-email"', JSON.stringify(queue)),
      ready: async () =>
        (await count("SELECT count(*) AS n FROM idem.outbox WHERE id = $1 AND published_at IS NOT NULL", [
          id,
        ])) === 1,
    });
    expectExited(result, "the relay");
  }, 90_000);

  it("the inbox applies the event once, and exits on SIGTERM after one stop()", async () => {
    const result = await docs.runBlock(inboxBlock, {
      env,
      timeoutMs: 30_000,
      rewrite: (code) => code.replaceAll('"receipt-email"', JSON.stringify(queue)),
      ready: async () => (await count("SELECT count(*) AS n FROM sent_emails", [])) === 1,
    });
    expectExited(result, "the inbox");
    expect((await db.query("SELECT order_id FROM sent_emails")).rows).toEqual([{ order_id: "order-1" }]);
  }, 90_000);

  it("on NATS: the consumer creates its stream, applies an event relayed to it, and exits on SIGTERM", async () => {
    const subject = `receipt-email-${own}`;
    const id = await orderPaid("order-2", subject);
    const relay = new Relay({ db, publisher: new NatsPublisher({ servers: NATS_URL }), topics: [subject] });
    let relayed = false;
    const result = await docs.runBlock(natsBlock, {
      env,
      timeoutMs: 30_000,
      rewrite: (code) =>
        code
          .replaceAll('"receipt-email"', JSON.stringify(subject))
          .replaceAll('"RECEIPTS"', JSON.stringify(stream))
          .replaceAll('"receipt-email-worker"', JSON.stringify(`worker-${own}`)),
      ready: async () => {
        // Once the block made the stream, relay the event to it (the relay of "The relay", on NATS).
        if (!relayed) relayed = (await relay.runOnce().catch(() => 0)) > 0 && (await published(id));
        return (
          relayed &&
          (await count("SELECT count(*) AS n FROM sent_emails WHERE order_id = $1", ["order-2"])) === 1
        );
      },
    });
    await relay.stop();
    expectExited(result, "the NATS consumer");
  }, 90_000);

  async function published(id: string): Promise<boolean> {
    return (
      (await count("SELECT count(*) AS n FROM idem.outbox WHERE id = $1 AND published_at IS NOT NULL", [
        id,
      ])) === 1
    );
  }
});
