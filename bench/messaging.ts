/**
 * Issue 5's benchmark, for RabbitMQ, NATS JetStream, Kafka and SQS (issue 60) on the real PostgreSQL, in
 * one run:
 *
 *   outbox -> broker     a backlog of events published by one relay (2 loops), with broker confirms
 *   broker -> inbox      the queued events consumed and applied through the inbox (effect committed)
 *   end to end           a backlog drained by relay and consumer running together
 *   latency              events written at a steady rate; from the outbox row's commit to its effect's
 *                        commit, p50 and p99
 *   ordered backlog      10,000 events over 40 aggregates waiting in the outbox, taken to the broker by
 *                        a relay alone, then another drained end to end by a relay with
 *                        `orderByAggregate` and a consumer applying one transaction at a time (which
 *                        keeps the order); each applied once and in order, checked (issue 16)
 *
 * CPU per event (the bench database's PostgreSQL backends, this process, the broker's process) is
 * printed beside every end to end figure.
 *
 * Each broker runs twice, with the two ways to write a consumer's effect: a handler that runs one
 * statement per message (simplest; each message costs a round trip inside the batch's transaction),
 * and a batch handler that writes a whole batch's effects in one statement (the way to throughput).
 * Relay and consumer share this process (in production they usually live in different services), so
 * the relay's publishing stalls the per-message consumer's round trips; the set-based one barely notices.
 *
 * Environment: DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test; a database of its own is
 * created and dropped), AMQP_URL, NATS_URL (loopback defaults), KAFKA_URL, SQS_URL (without them Kafka
 * and ElasticMQ are started here: bench/messaging-kafka-sqs.ts), BENCH_BROKERS (default
 * rabbitmq,nats,kafka,sqs), BENCH_EVENTS (default 20,000),
 * BENCH_RATE (events/s for the latency run, default 1,000), BENCH_HANDLER (message, batch, both
 * (the default) or none), BENCH_DRAIN=0 skips the ordered backlog. Run: `npx tsx --conditions=source bench/messaging.ts`.
 */

import { readdirSync, readFileSync } from "node:fs";
import { jetstreamManager, StorageType } from "@nats-io/jetstream";
import amqp from "amqplib";
import { AmqpPublisher, consumeAmqp } from "../src/messaging/amqp.ts";
import { Inbox } from "../src/messaging/inbox.ts";
import { connectNats, consumeNats, NatsPublisher } from "../src/messaging/nats.ts";
import { Relay } from "../src/messaging/relay.ts";
import type { Db } from "../src/postgres/db.ts";
import { listenWithPg } from "../src/postgres/drivers/listen.ts";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { writeOutbox } from "../src/postgres/outbox.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { orderedEffect, orderedResult, prepareOrdered, writeBacklog } from "../test/messaging/ordered.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";
import { kafka, sqs, startBenchBrokers, stopBenchBrokers } from "./messaging-kafka-sqs.ts";
import { type Broker, type EffectStyle, handlers } from "./messaging-shared.ts";

export type { EffectStyle } from "./messaging-shared.ts";

const AMQP_URL = process.env.AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672";
const NATS_URL = process.env.NATS_URL ?? "nats://127.0.0.1:4222";
const EVENTS = Number(process.env.BENCH_EVENTS ?? 20_000);
const RATE = Number(process.env.BENCH_RATE ?? 1_000);

export interface MessagingRow {
  broker: string;
  /** For the report; default "<broker>: end to end, effect per message|batch". */
  scenario?: string;
  /** "message": one statement per message; "batch": one statement per batch. */
  effect: EffectStyle;
  publishRate: number;
  consumeRate: number;
  endToEndRate: number;
  p50Ms?: number;
  p99Ms?: number;
  /** End to end: CPU per event (µs) of the bench database's backends, this process, the broker. */
  cpu?: { postgres: number; process: number; broker: number };
}

/**
 * CPU time (ms) of the processes whose command line contains `match` (Linux /proc; 0 elsewhere): the
 * PostgreSQL backends of one database, or a broker (shared with whatever else uses it).
 */
function cpuOf(match: string): number {
  let ticks = 0;
  let pids: string[] = [];
  try {
    pids = readdirSync("/proc").filter((p) => /^\d+$/.test(p));
  } catch {
    return 0;
  }
  for (const pid of pids) {
    try {
      if (!readFileSync(`/proc/${pid}/cmdline`, "utf8").includes(match)) continue;
      const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
      ticks += Number(f[11]) + Number(f[12]); // utime, stime
    } catch {
      // gone meanwhile
    }
  }
  return ticks * 10; // USER_HZ is 100 on Linux
}

/** Starts counting CPU; `perEvent(n)` gives µs per event since then. */
function cpuMeter(database: string, broker: string) {
  const pg0 = cpuOf(`${database} `);
  const br0 = cpuOf(broker);
  const self0 = process.cpuUsage();
  return (n: number) => {
    const self = process.cpuUsage(self0);
    return {
      postgres: ((cpuOf(`${database} `) - pg0) * 1000) / n,
      process: (self.user + self.system) / n,
      broker: ((cpuOf(broker) - br0) * 1000) / n,
    };
  };
}

async function rabbit(): Promise<Broker> {
  const queue = `idem_bench_${Date.now()}`;
  const admin = await amqp.connect(AMQP_URL);
  const ch = await admin.createChannel();
  await ch.assertQueue(queue, { durable: true });
  return {
    name: "RabbitMQ",
    process: "beam.smp",
    topic: queue,
    publisher: () => new AmqpPublisher({ url: AMQP_URL }),
    consume: (db, consumer, style) =>
      consumeAmqp({
        url: AMQP_URL,
        queue,
        inbox: new Inbox(db, { consumer }),
        ...handlers(style),
        prefetch: 1_024,
      }),
    async reset() {
      await ch.purgeQueue(queue);
    },
    async cleanup() {
      await ch.deleteQueue(queue).catch(() => {});
      await admin.close();
    },
  };
}

async function nats(): Promise<Broker> {
  const stream = `IDEM_BENCH_${Date.now()}`;
  const nc = await connectNats(NATS_URL); // with the library's defaults, as a service connects
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({ name: stream, subjects: [`${stream}.>`], storage: StorageType.File });
  const topic = `${stream}.events`;
  let n = 0;
  return {
    name: "NATS JetStream",
    process: "nats-server",
    topic,
    publisher: () => new NatsPublisher({ connection: nc }),
    consume: (db, consumer, style) =>
      consumeNats({
        connection: nc,
        stream,
        durable: `c${n++}`,
        create: { filterSubject: topic, maxAckPending: 4_096 },
        inbox: new Inbox(db, { consumer }),
        ...handlers(style),
        prefetch: 1_024,
      }),
    async reset() {
      await jsm.streams.purge(stream);
    },
    async cleanup() {
      await jsm.streams.delete(stream).catch(() => {});
      await nc.close();
    },
  };
}

const STYLES: EffectStyle[] =
  process.env.BENCH_HANDLER === "message" || process.env.BENCH_HANDLER === "batch"
    ? [process.env.BENCH_HANDLER]
    : process.env.BENCH_HANDLER === "none"
      ? []
      : ["message", "batch"];

async function writeEvents(db: Db, topic: string, n: number, perTx = 500, writers = 4): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: writers }, async () => {
      while (next < n) {
        const start = next;
        next += perTx;
        await db.transaction(async (tx) => {
          for (let i = start; i < Math.min(n, start + perTx); i++) {
            await writeOutbox(tx, { topic, type: "bench", payload: { i } });
          }
        });
      }
    }),
  );
}

async function count(db: Db, sql: string, params: unknown[] = []): Promise<number> {
  const { rows } = await db.query<{ n: string }>(sql, params);
  return Number(rows[0]!.n);
}

async function waitFor(check: () => Promise<boolean>, what: string, ms = 120_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`benchmark stuck waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

async function runBroker(make: () => Promise<Broker>, style: EffectStyle): Promise<MessagingRow> {
  const fresh = await freshBenchDatabase();
  const pool = benchPool(fresh.url, { max: 24, pipeline: true });
  const db = fromPg(pool);
  const broker = await make();
  try {
    await migrate(db);
    await db.exec(`CREATE TABLE bench_effects (
      message_id text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())`);
    const unpublished = () =>
      count(db, "SELECT count(*) AS n FROM idem.outbox WHERE published_at IS NULL AND topic = $1", [
        broker.topic,
      ]);

    // 1. outbox -> broker
    await writeEvents(db, broker.topic, EVENTS);
    const publisher = broker.publisher();
    const relayOptions = { db, publisher, topics: [broker.topic], batchSize: 500, concurrency: 2 };
    let relay = new Relay({ ...relayOptions, pollMs: 5 });
    let t0 = performance.now();
    await relay.start();
    await waitFor(async () => (await unpublished()) === 0, "the relay");
    const publishRate = EVENTS / ((performance.now() - t0) / 1000);
    await relay.stop();

    // 2. broker -> committed effect
    t0 = performance.now();
    let consumer = await broker.consume(db, "bench-1", style);
    await waitFor(async () => consumer.stats.applied >= EVENTS, "the consumer");
    const consumeRate = EVENTS / ((performance.now() - t0) / 1000);
    await consumer.stop();

    // 3. end to end: a backlog drained by relay and consumer together
    await db.exec("TRUNCATE bench_effects");
    await broker.reset();
    await writeEvents(db, broker.topic, EVENTS);
    consumer = await broker.consume(db, "bench-2", style);
    relay = new Relay({ ...relayOptions, pollMs: 5 });
    const cpu = cpuMeter(new URL(fresh.url).pathname.slice(1), broker.process);
    t0 = performance.now();
    await relay.start();
    await waitFor(async () => consumer.stats.applied >= EVENTS, "end to end");
    const endToEndRate = EVENTS / ((performance.now() - t0) / 1000);
    const cpuUs = cpu(EVENTS);
    await relay.stop();

    // 4. latency at a steady rate, the relay woken by NOTIFY
    await db.exec("TRUNCATE bench_effects");
    const applied = consumer.stats.applied;
    const listenPool = benchPool(fresh.url, { max: 1 });
    relay = new Relay({ ...relayOptions, listen: listenWithPg(() => listenPool.connect()) });
    await relay.start();
    const seconds = 5;
    const perTick = Math.max(1, Math.round(RATE / 100)); // one transaction of `perTick` events every 10 ms
    const total = perTick * 100 * seconds;
    for (let written = 0; written < total; written += perTick) {
      const tick = new Promise((r) => setTimeout(r, 10));
      await db.transaction(async (tx) => {
        for (let i = 0; i < perTick; i++)
          await writeOutbox(tx, { topic: broker.topic, type: "bench", payload: { i } });
      });
      await tick;
    }
    await waitFor(async () => consumer.stats.applied - applied >= total, "the latency run");
    await relay.stop();
    await consumer.stop();
    await listenPool.end();
    await publisher.close();
    const { rows } = await db.query<{ p50: number; p99: number }>(
      `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,
              percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99
       FROM (SELECT extract(epoch FROM e.applied_at - o.created_at) * 1000 AS ms
             FROM bench_effects e JOIN idem.outbox o ON o.id::text = e.message_id) l`,
    );
    return {
      broker: broker.name,
      effect: style,
      publishRate,
      consumeRate,
      endToEndRate,
      p50Ms: Number(rows[0]!.p50),
      p99Ms: Number(rows[0]!.p99),
      cpu: cpuUs,
    };
  } finally {
    await broker.cleanup();
    await db.close();
    await fresh.drop();
  }
}

/**
 * Issue 16: a backlog of 10,000 events over 40 aggregates (no new commits) taken to the broker by an
 * ordered relay alone (no consumer), then another drained end to end by the ordered relay and a
 * consumer running one transaction at a time (which keeps each aggregate's order). `pipeline`: the
 * relay sends each batch in one call instead of a chain of confirms per aggregate (issue 33).
 * Throws if an event was lost, applied twice or out of order.
 */
async function orderedDrain(make: () => Promise<Broker>, pipeline: boolean): Promise<MessagingRow> {
  const n = 10_000;
  const fresh = await freshBenchDatabase();
  const pool = benchPool(fresh.url, { max: 24, pipeline: true });
  const db = fromPg(pool);
  const broker = await make();
  try {
    await migrate(db);
    await prepareOrdered(db);
    const publisher = broker.publisher();
    const relayOptions = {
      db,
      publisher,
      topics: [broker.topic],
      orderByAggregate: true,
      pipeline,
      pollMs: 5_000,
    };
    // 1. the relay alone
    await writeBacklog(db, broker.topic, n, 40);
    let relay = new Relay(relayOptions);
    let t0 = performance.now();
    await relay.start();
    await waitFor(async () => relay.stats.published >= n, "the ordered relay");
    const publishRate = n / ((performance.now() - t0) / 1000);
    await relay.stop();
    await broker.reset();
    // 2. end to end
    await writeBacklog(db, broker.topic, n, 40);
    const consumer = await broker.consume(db, "drain", {
      batchHandler: orderedEffect("drain"),
      batchSize: 500,
      concurrency: 1,
    });
    relay = new Relay(relayOptions);
    const cpu = cpuMeter(new URL(fresh.url).pathname.slice(1), broker.process);
    t0 = performance.now();
    await relay.start();
    await waitFor(async () => consumer.stats.applied >= n, "the ordered drain");
    const endToEndRate = n / ((performance.now() - t0) / 1000);
    const cpuUs = cpu(n);
    await relay.stop();
    await consumer.stop();
    await publisher.close();
    const r = await orderedResult(db, "drain");
    if (r.total !== n || r.distinct !== n || r.outOfOrder !== 0) {
      throw new Error(`ordered drain: ${JSON.stringify(r)} (expected ${n} once each, in order)`);
    }
    return {
      broker: broker.name,
      scenario: `${broker.name}: ordered backlog of ${n.toLocaleString("en")} over 40 aggregates${pipeline ? ", pipelined" : ""}`,
      effect: "batch",
      publishRate,
      consumeRate: Number.NaN,
      endToEndRate,
      cpu: cpuUs,
    };
  } finally {
    await broker.cleanup();
    await db.close();
    await fresh.drop();
  }
}

export function printMessagingRows(all: MessagingRow[]): void {
  const rows = all.filter((r) => r.scenario === undefined);
  const drains = all.filter((r) => r.scenario !== undefined);
  console.log(`\nOutbox -> broker -> inbox (${EVENTS.toLocaleString("en")} events; latency at ${RATE}/s)`);
  const head = [
    "broker".padEnd(16),
    "effect".padEnd(15),
    "outbox->broker/s".padStart(18),
    "broker->inbox/s".padStart(17),
    "end-to-end/s".padStart(14),
    "p50 ms".padStart(9),
    "p99 ms".padStart(9),
    "  CPU us/event e2e: PG+process+broker",
  ];
  console.log(head.join(""));
  for (const r of rows) {
    const cells = [
      r.broker.padEnd(16),
      (r.effect === "batch" ? "per batch" : "per message").padEnd(15),
      Math.round(r.publishRate).toString().padStart(18),
      Math.round(r.consumeRate).toString().padStart(17),
      Math.round(r.endToEndRate).toString().padStart(14),
      (r.p50Ms?.toFixed(1) ?? "").padStart(9),
      (r.p99Ms?.toFixed(1) ?? "").padStart(9),
      r.cpu ? `  ${cpuText(r.cpu)}` : "",
    ];
    console.log(cells.join(""));
  }
  for (const r of drains) {
    // Against the same broker's unordered end to end with a batch effect, measured in this run.
    const unordered = rows.find((u) => u.broker === r.broker && u.effect === "batch");
    let ratio = unordered ? `, ${(r.endToEndRate / unordered.endToEndRate).toFixed(2)} of unordered` : "";
    // A pipelined drain against the chained one just before it (same broker, same round).
    const chained = drains[drains.indexOf(r) - 1];
    if (r.scenario!.endsWith("pipelined") && chained?.broker === r.broker) {
      ratio += `, x${(r.publishRate / chained.publishRate).toFixed(2)} relay alone and x${(r.endToEndRate / chained.endToEndRate).toFixed(2)} end to end against chains`;
    }
    console.log(
      `${r.scenario}: relay alone ${Math.round(r.publishRate)} events/s, end to end ${Math.round(r.endToEndRate)} events/s${ratio} (order kept, each once)`,
    );
    if (r.cpu && r.cpu.postgres + r.cpu.broker > 0) {
      console.log(
        `  CPU per event end to end: PostgreSQL backends ${Math.round(r.cpu.postgres)} us, this process ${Math.round(r.cpu.process)} us, broker ${Math.round(r.cpu.broker)} us (shared with its other clients)`,
      );
    }
  }
  console.log("goal: end-to-end >= 5,000 events/s on this machine");
  // Issue 60's goal: Kafka ordered end to end at least RabbitMQ's, the same way, in this run.
  for (const way of ["", ", pipelined"]) {
    const of = (broker: string) =>
      drains.filter((d) => d.broker === broker && d.scenario!.endsWith(`aggregates${way}`));
    const k = of("Kafka");
    const r = of("RabbitMQ");
    if (k.length === 0 || r.length === 0) continue;
    const mean = (xs: MessagingRow[]) => xs.reduce((a, x) => a + x.endToEndRate, 0) / xs.length;
    console.log(
      `goal: Kafka ordered end to end${way || ", chains"} >= RabbitMQ's: ${Math.round(mean(k))} against ${Math.round(mean(r))} events/s, x${(mean(k) / mean(r)).toFixed(2)}`,
    );
  }
}

/** `total (PostgreSQL + process + broker)` in µs per event. */
function cpuText(c: { postgres: number; process: number; broker: number }): string {
  const t = Math.round(c.postgres + c.process + c.broker);
  return `${t} (${Math.round(c.postgres)} + ${Math.round(c.process)} + ${Math.round(c.broker)})`;
}

/**
 * Every broker (BENCH_BROKERS, default rabbitmq,nats,kafka,sqs), each with both effect styles
 * (BENCH_HANDLER picks one), then the ordered drains. Returns the rows it printed.
 */
export async function messagingBench(): Promise<MessagingRow[]> {
  const wanted = (process.env.BENCH_BROKERS ?? "rabbitmq,nats,kafka,sqs").split(",");
  const all: [string, () => Promise<Broker>, boolean[]][] = [
    ["rabbitmq", rabbit, [false, true]],
    ["nats", nats, [false, true]],
    ["kafka", kafka, [false, true]],
    // SQS keeps no order across a call's batches (no `pipeline`); the drain needs a FIFO queue.
    ["sqs", () => sqs(), []],
    ["sqs", () => sqs(true), [false]],
  ];
  const brokers = all.filter(([name]) => wanted.includes(name));
  if (wanted.includes("kafka") || wanted.includes("sqs")) startBenchBrokers();
  const rows: MessagingRow[] = [];
  try {
    for (const [, make, ways] of brokers) {
      if (ways.length === 1) continue; // the FIFO queue is for the drains only
      for (const style of STYLES) rows.push(await runBroker(make, style));
    }
    // Chains and pipelined, interleaved (BENCH_DRAIN_ROUNDS rounds, default 1), so ratios compare like with like.
    const rounds = process.env.BENCH_DRAIN === "0" ? 0 : Number(process.env.BENCH_DRAIN_ROUNDS ?? 1);
    for (let i = 0; i < rounds; i++) {
      for (const [, make, ways] of brokers) {
        for (const pipeline of ways) rows.push(await orderedDrain(make, pipeline));
      }
    }
  } finally {
    stopBenchBrokers();
  }
  printMessagingRows(rows);
  return rows;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  messagingBench().catch((err) => {
    console.error(err);
    process.exit(1);
  });
}
