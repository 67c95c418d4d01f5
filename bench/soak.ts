/**
 * Issue 33: runs for months. `npm run bench -- soak` (not part of a plain `npm run bench`: it takes a
 * while). Two parts, each reporting heap after a forced GC and RSS over time:
 *
 *   messaging  SOAK_EVENTS events (default 1,000,000) written into the outbox by a producer (500 per
 *              statement, round robin over 100 aggregates, never more than 20,000 ahead of the
 *              consumer), published by an ordered relay and applied by an inbox consumer (one
 *              transaction at a time, batches of up to 500), on RabbitMQ and on NATS JetStream, all in
 *              this process; then every event is checked: applied once, in order per aggregate. The
 *              relay keeps published rows 2 minutes (a day in production), so the outbox stays small
 *              as it would over months.
 *   service    SOAK_PAYMENTS keyed payments (default 1,000,000) against the reference service (its own
 *              process, phases mode, the in-process provider simulator keeping keys and charges for
 *              PROVIDER_RETENTION_MS, default 60 s: a compressed day), 32 at a time over node:http
 *              keep-alive connections from this process; then every payment is checked: the 201s
 *              the client got, the charges the provider made, the payment rows (distinct ids, each
 *              derived from its charge) and the receipt emails all agree. The soak database runs with
 *              synchronous_commit off (SOAK_SYNCHRONOUS_COMMIT=on to keep it): a commit then does
 *              not wait for the disk's fsync, which bounded the rate at low concurrency here, and
 *              nothing the service does or holds changes.
 *
 * SOAK_PART=messaging|service (default both), SOAK_BROKERS=rabbitmq,nats,kafka (Kafka at KAFKA_URL, else
 * one started for the run: bench/messaging-kafka-sqs.ts), SOAK_SERVICE_SECONDS (stop the
 * service part after this long and report what was done), SOAK_SAMPLE_EVERY (payments between two
 * service samples, default a twentieth), SOAK_SERVICE_CONCURRENCY (payments at a time, default 32). Needs PostgreSQL
 * (DATABASE_URL, a database of its own is created and dropped), RabbitMQ (AMQP_URL) and NATS (NATS_URL).
 * Heap growth is given per event (or payment) from the sample at 10% to the last (warm-up excluded),
 * and as a least-squares slope over the samples from 10% on.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import http from "node:http";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { jetstreamManager, StorageType } from "@nats-io/jetstream";
import { Admin } from "@platformatic/kafka";
import amqp from "amqplib";
import pg from "pg";
import { AmqpPublisher, consumeAmqp } from "../src/messaging/amqp.ts";
import type { RunningConsumer } from "../src/messaging/consumer.ts";
import { Inbox } from "../src/messaging/inbox.ts";
import { consumeKafka, KafkaPublisher, kafkaBrokers } from "../src/messaging/kafka.ts";
import { connectNats, consumeNats, NatsPublisher } from "../src/messaging/nats.ts";
import { Relay } from "../src/messaging/relay.ts";
import type { Publisher } from "../src/messaging/types.ts";
import type { Db } from "../src/postgres/db.ts";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { uuidv7 } from "../src/postgres/uuid7.ts";
import { startProvider } from "../src/testing/provider.ts";
import { listCharges } from "../src/testing/provider-client.ts";
import { orderedEffect, orderedResult, prepareOrdered } from "../test/messaging/ordered.ts";
import { benchPool, freshBenchDatabase } from "./http.ts";
import { benchBrokerUrls, startBenchBrokers, stopBenchBrokers } from "./messaging-kafka-sqs.ts";

const AMQP_URL = process.env.AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672";
const NATS_URL = process.env.NATS_URL ?? "nats://127.0.0.1:4222";

/** A full collection, as `--expose-gc` would give (enabled here, so no node flag is needed). */
export const forceGc: () => void = (() => {
  setFlagsFromString("--expose-gc");
  return runInNewContext("gc") as () => void;
})();

export interface Sample {
  /** Events applied (or payments answered) so far. */
  n: number;
  seconds: number;
  heapMB: number;
  rssMB: number;
}

export interface SoakResult {
  name: string;
  n: number;
  seconds: number;
  rate: number;
  samples: Sample[];
  /** Heap growth per event (bytes) from the sample at 10% to the last. */
  bytesPer: number;
  /** Least-squares slope of heap over events from 10% on (bytes per event). */
  slopeBytesPer: number;
  /** Heap at the last sample minus heap at the sample at 10% (MB). */
  growthMB: number;
  check?: { total: number; distinct: number; outOfOrder: number };
  /** The service part: what the client got and what was charged and written (chargedOnce). */
  payments?: { answered: number; created: number } & ChargeCheck;
}

export interface ChargeCheck {
  /** Charges the provider simulator made over the run (the sequence number of its last one). */
  charges: number;
  /** Payment rows in the service's database, and distinct ids among them (one per charge). */
  rows: number;
  distinct: number;
  /** Receipt emails recorded (distinct payments), once the receipt worker has caught up. */
  receipts: number;
}

/**
 * Every payment charged once: the provider's charge count, the payment rows (each derives its id from
 * its charge) and the receipts, against the 201s the client got.
 */
async function chargedOnce(
  url: string,
  providerUrl: string | undefined,
  created: number,
  log: (line: string) => void,
): Promise<ChargeCheck> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    const { rows } = await c.query<{ rows: string; distinct: string }>(
      "SELECT count(*) AS rows, count(DISTINCT id) AS distinct FROM payments",
    );
    const receiptsNow = async () =>
      Number(
        (await c.query<{ n: string }>("SELECT count(DISTINCT payment_id) AS n FROM sent_emails")).rows[0]!.n,
      );
    const live = providerUrl ? await listCharges(providerUrl) : [];
    let receipts = await receiptsNow();
    for (let waited = 0; receipts < created && waited < 120; waited++) {
      await new Promise((r) => setTimeout(r, 1_000));
      receipts = await receiptsNow();
    }
    const check = {
      charges: live.at(-1)?.seq ?? 0,
      rows: Number(rows[0]!.rows),
      distinct: Number(rows[0]!.distinct),
      receipts,
    };
    log(
      `service check: ${created.toLocaleString("en")} answered 201, ${check.charges.toLocaleString("en")} charges at the provider, ${check.rows.toLocaleString("en")} payment rows (${check.distinct.toLocaleString("en")} distinct), ${check.receipts.toLocaleString("en")} receipts`,
    );
    return check;
  } finally {
    await c.end();
  }
}

function summarise(name: string, n: number, seconds: number, samples: Sample[]): SoakResult {
  const from = samples.find((s) => s.n >= n / 10) ?? samples[0]!;
  const last = samples.at(-1)!;
  const later = samples.filter((s) => s.n >= from.n);
  const mx = later.reduce((a, s) => a + s.n, 0) / later.length;
  const my = later.reduce((a, s) => a + s.heapMB, 0) / later.length;
  const sxx = later.reduce((a, s) => a + (s.n - mx) ** 2, 0);
  const sxy = later.reduce((a, s) => a + (s.n - mx) * (s.heapMB - my), 0);
  return {
    name,
    n,
    seconds,
    rate: n / seconds,
    samples,
    bytesPer: last.n > from.n ? ((last.heapMB - from.heapMB) * 2 ** 20) / (last.n - from.n) : 0,
    slopeBytesPer: sxx > 0 ? (sxy / sxx) * 2 ** 20 : 0,
    growthMB: last.heapMB - from.heapMB,
  };
}

/** Heap after a forced collection and RSS of this process. */
export function localMemory(): { heapMB: number; rssMB: number } {
  forceGc();
  forceGc();
  const m = process.memoryUsage();
  return { heapMB: m.heapUsed / 2 ** 20, rssMB: m.rss / 2 ** 20 };
}

interface SoakBroker {
  name: string;
  topic: string;
  publisher: Publisher;
  consume(db: Db, consumer: string): Promise<RunningConsumer>;
  cleanup(): Promise<void>;
}

const consumerOptions = (db: Db, consumer: string) => ({
  inbox: new Inbox(db, { consumer }),
  batchHandler: orderedEffect(consumer),
  batchSize: 500,
  concurrency: 1,
  prefetch: 1_024,
});

async function rabbitmq(): Promise<SoakBroker> {
  const queue = `idem_soak_${randomUUID().slice(0, 8)}`;
  const admin = await amqp.connect(AMQP_URL);
  const ch = await admin.createChannel();
  await ch.assertQueue(queue, { durable: true });
  return {
    name: "RabbitMQ",
    topic: queue,
    publisher: new AmqpPublisher({ url: AMQP_URL }),
    consume: (db, consumer) => consumeAmqp({ url: AMQP_URL, queue, ...consumerOptions(db, consumer) }),
    async cleanup() {
      await ch.deleteQueue(queue).catch(() => {});
      await admin.close();
    },
  };
}

async function nats(): Promise<SoakBroker> {
  const stream = `IDEM_SOAK_${randomUUID().slice(0, 8).toUpperCase()}`;
  const nc = await connectNats(NATS_URL);
  const jsm = await jetstreamManager(nc);
  // Messages are dropped once acked, so the stream holds what is in flight, not the whole run.
  await jsm.streams.add({
    name: stream,
    subjects: [`${stream}.>`],
    storage: StorageType.File,
    retention: "workqueue" as never,
  });
  const topic = `${stream}.events`;
  return {
    name: "NATS JetStream",
    topic,
    publisher: new NatsPublisher({ connection: nc }),
    consume: (db, consumer) =>
      consumeNats({
        connection: nc,
        stream,
        durable: consumer,
        create: { filterSubject: topic, maxAckPending: 4_096 },
        ...consumerOptions(db, consumer),
      }),
    async cleanup() {
      await jsm.streams.delete(stream).catch(() => {});
      await nc.close();
    },
  };
}

export const SOAK_BROKERS = { rabbitmq, nats } as const;

/** Kafka (issue 60) at `brokers`: a topic of 6 partitions, a consumer group, deleted afterwards. */
export function kafkaSoak(brokers: string): () => Promise<SoakBroker> {
  return async () => {
    const topic = `idem_soak_${randomUUID().slice(0, 8)}`;
    const admin = new Admin({ clientId: "idem-soak", bootstrapBrokers: kafkaBrokers(brokers) });
    await admin.createTopics({ topics: [topic], partitions: 6, replicas: -1 });
    return {
      name: "Kafka",
      topic,
      publisher: new KafkaPublisher({ brokers }),
      consume: (db, consumer) =>
        consumeKafka({ brokers, topics: topic, groupId: topic, ...consumerOptions(db, consumer) }),
      async cleanup() {
        await admin.deleteTopics({ topics: [topic] }).catch(() => {});
        await admin.close();
      },
    };
  };
}

/** Write events `from`..`from + count - 1` in one statement (ids in write order, like writeOutbox's). */
async function produce(db: Db, topic: string, from: number, count: number, aggregates: number) {
  const ids: string[] = [];
  const aggs: string[] = [];
  const payloads: string[] = [];
  for (let i = from; i < from + count; i++) {
    const agg = `a${i % aggregates}`;
    ids.push(uuidv7());
    aggs.push(agg);
    payloads.push(JSON.stringify({ agg, seq: Math.floor(i / aggregates) }));
  }
  await db.query(
    `INSERT INTO idem.outbox (id, topic, type, payload, aggregate_type, aggregate_id)
     SELECT unnest($1::uuid[]), $2::text, 'step', unnest($3::jsonb[]), 'account', unnest($4::text[])`,
    [ids, topic, payloads, aggs],
  );
}

/**
 * `events` events through outbox -> ordered relay -> broker -> inbox, heap sampled every `sampleEvery`
 * events applied. Checks every event at the end (applied once, in order per aggregate).
 */
export async function soakMessaging(
  make: () => Promise<SoakBroker>,
  options: { events: number; sampleEvery: number; aggregates?: number; log?: (line: string) => void },
): Promise<SoakResult> {
  const { events, sampleEvery } = options;
  const aggregates = options.aggregates ?? 100;
  const log = options.log ?? (() => {});
  const fresh = await freshBenchDatabase();
  const pool = benchPool(fresh.url, { max: 12 });
  const db = fromPg(pool);
  const broker = await make();
  let relay: Relay | undefined;
  let consumer: RunningConsumer | undefined;
  try {
    await migrate(db);
    await prepareOrdered(db);
    consumer = await broker.consume(db, "soak");
    relay = new Relay({
      db,
      publisher: broker.publisher,
      topics: [broker.topic],
      orderByAggregate: true,
      retentionMs: 120_000,
      cleanupEveryMs: 15_000,
    });
    await relay.start();
    const c = consumer;
    const samples: Sample[] = [];
    const t0 = performance.now();
    const sample = () => {
      const s = { n: c.stats.applied, seconds: (performance.now() - t0) / 1000, ...localMemory() };
      samples.push(s);
      log(
        `${broker.name}: ${s.n.toLocaleString("en")} applied, ${s.seconds.toFixed(0)} s, heap ${s.heapMB.toFixed(1)} MB, rss ${s.rssMB.toFixed(0)} MB`,
      );
    };
    sample();
    let written = 0;
    let nextSample = sampleEvery;
    const producing = (async () => {
      while (written < events) {
        if (written - c.stats.applied > 20_000) {
          await new Promise((r) => setTimeout(r, 20));
          continue;
        }
        const count = Math.min(500, events - written);
        await produce(db, broker.topic, written, count, aggregates);
        written += count;
      }
    })();
    let stalled = performance.now();
    let last = 0;
    while (c.stats.applied < events) {
      await new Promise((r) => setTimeout(r, 50));
      if (c.stats.applied >= nextSample) {
        sample();
        nextSample += sampleEvery;
      }
      if (c.stats.applied !== last) {
        last = c.stats.applied;
        stalled = performance.now();
      } else if (performance.now() - stalled > 120_000) {
        throw new Error(`soak stuck at ${last} of ${events} applied`);
      }
    }
    await producing;
    const seconds = (performance.now() - t0) / 1000;
    if (samples.at(-1)!.n < events) sample();
    await relay.stop();
    await consumer.stop();
    const result = summarise(broker.name, events, seconds, samples);
    result.check = await orderedResult(db, "soak");
    return result;
  } finally {
    await relay?.stop();
    await consumer?.stop();
    await broker.publisher.close();
    await broker.cleanup();
    await db.close();
    await fresh.drop();
  }
}

/** The reference service in a process of its own that reports its heap after GC when asked (IPC). */
async function startSoakService(env: Record<string, string>): Promise<{
  url: string;
  child: ChildProcess;
  memory(): Promise<{ heapMB: number; rssMB: number }>;
}> {
  const child = spawn(
    process.execPath,
    ["--import", "tsx", "--conditions=source", new URL("./soak-service.ts", import.meta.url).pathname],
    { env: { ...process.env, ...env }, stdio: ["ignore", "inherit", "inherit", "ipc"] },
  );
  const url = await new Promise<string>((resolve, reject) => {
    child.once("message", (m: { url?: string }) => (m.url ? resolve(m.url) : reject(new Error("no url"))));
    child.once("exit", (code) => reject(new Error(`service exited (${code})`)));
  });
  return {
    url,
    child,
    memory: () =>
      new Promise((resolve) => {
        child.once("message", (m: { heapMB: number; rssMB: number }) => resolve(m));
        child.send("memory");
      }),
  };
}

/** `payments` keyed payments against the reference service, its heap after GC sampled along the way. */
export async function soakService(options: {
  payments: number;
  sampleEvery: number;
  /** Stop sending after this long (the result then covers the payments answered). Default: no limit. */
  maxSeconds?: number;
  concurrency?: number;
  /** How long the provider simulator keeps a key and its charge. Default: PROVIDER_RETENTION_MS, else 60 s. */
  providerRetentionMs?: number;
  /** The soak database's synchronous_commit (default off: a commit does not wait for the disk's fsync). */
  synchronousCommit?: "on" | "off";
  log?: (line: string) => void;
}): Promise<SoakResult> {
  const log = options.log ?? (() => {});
  const fresh = await freshBenchDatabase();
  const syncCommit = options.synchronousCommit ?? "off";
  const admin = new pg.Client({ connectionString: fresh.url });
  await admin.connect();
  // The database's own setting, before the service connects: it changes when a commit waits for its WAL
  // flush (the disk's fsync, several ms each here), not what the service does or holds.
  await admin.query(
    `ALTER DATABASE ${new URL(fresh.url).pathname.slice(1)} SET synchronous_commit = ${syncCommit === "on" ? "on" : "off"}`,
  );
  await admin.end();
  // The payment provider runs here, beside the load, not inside the service: its charges and the
  // webhooks it has yet to deliver are the provider's memory, not the service's (in process, a busy
  // machine's backlog of charge webhooks read as the service's heap growing by kilobytes per payment).
  const webhookSecret = `whsec_${randomBytes(24).toString("base64")}`;
  let webhookUrl: string | undefined;
  const provider = await startProvider({
    retentionMs: options.providerRetentionMs ?? Number(process.env.PROVIDER_RETENTION_MS ?? 60_000),
    webhooks: { url: () => webhookUrl, secret: webhookSecret },
  });
  const svc = await startSoakService({
    DATABASE_URL: fresh.url,
    PORT: "0",
    PROVIDER_URL: provider.url,
    PROVIDER_WEBHOOK_SECRET: webhookSecret,
    IDEM_DEMO: "1",
    LOG_LEVEL: "warn",
    IDEM_POOL_SIZE: "16",
  }).catch(async (err) => {
    await provider.close();
    throw err;
  });
  webhookUrl = new URL("/v1/webhooks/provider", svc.url).toString();
  try {
    const samples: Sample[] = [];
    const t0 = performance.now();
    const sample = async (n: number) => {
      const s = { n, seconds: (performance.now() - t0) / 1000, ...(await svc.memory()) };
      samples.push(s);
      log(
        `service: ${n.toLocaleString("en")} payments, ${s.seconds.toFixed(0)} s, heap ${s.heapMB.toFixed(1)} MB, rss ${s.rssMB.toFixed(0)} MB`,
      );
    };
    await sample(0);
    let sent = 0;
    let answered = 0;
    let created = 0;
    let bad = 0;
    let nextSample = options.sampleEvery;
    let sampling: Promise<void> = Promise.resolve();
    const deadline = t0 + (options.maxSeconds ?? Number.POSITIVE_INFINITY) * 1000;
    // node:http on a keep-alive agent rather than fetch: the load generator's own CPU (undici's fetch costs
    // several times as much per request) comes out of the same two cores as the service's.
    const concurrency = options.concurrency ?? 32;
    const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });
    const target = new URL("/v1/payments", svc.url);
    const body = JSON.stringify({ amount_cents: 5000, currency: "eur", card: "4242424242424242" });
    const post = (key: string) =>
      new Promise<number>((resolve, reject) => {
        const req = http.request(
          {
            agent,
            host: target.hostname,
            port: target.port,
            path: target.pathname,
            method: "POST",
            headers: {
              authorization: "Bearer sk_test_demo_1",
              "content-type": "application/json",
              "content-length": Buffer.byteLength(body),
              "idempotency-key": key,
            },
          },
          (res) => {
            res.resume();
            res.once("end", () => resolve(res.statusCode ?? 0));
            res.once("error", reject);
          },
        );
        req.once("error", reject);
        req.end(body);
      });
    // A kept-alive socket the server closes as a request goes out fails with ECONNRESET (more often on
    // a loaded machine): the request is sent again with the same key, as a client of idem does (a 409
    // while the first attempt still runs is asked again), and the payment still counts once.
    const postOnce = async (key: string) => {
      let resent = false;
      for (let attempt = 1; ; attempt++) {
        try {
          const status = await post(key);
          if (status !== 409 || !resent || attempt >= 100) return status;
        } catch (err) {
          const code = (err as NodeJS.ErrnoException).code;
          if (attempt >= 5 || (code !== "ECONNRESET" && code !== "EPIPE")) throw err;
          resent = true;
        }
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    const worker = async () => {
      while (sent < options.payments && performance.now() < deadline) {
        sent++;
        const status = await postOnce(randomUUID());
        if (status === 201) created++;
        else bad++;
        if (++answered >= nextSample) {
          nextSample += options.sampleEvery;
          const n = answered;
          sampling = sampling.then(() => sample(n));
          await sampling;
        }
      }
    };
    await Promise.all(Array.from({ length: concurrency }, worker));
    agent.destroy();
    await sampling;
    const seconds = (performance.now() - t0) / 1000;
    if (bad > 0) log(`service: ${bad} payments answered other than 201`);
    if (samples.at(-1)!.n < answered) await sample(answered);
    const check = await chargedOnce(fresh.url, provider.url, created, log);
    const result = summarise("reference service", answered, seconds, samples);
    result.payments = { answered, created, ...check };
    return result;
  } finally {
    svc.child.kill("SIGTERM");
    await new Promise((r) => svc.child.once("exit", r));
    await provider.close();
    await fresh.drop();
  }
}

/**
 * Heap growth per item (bytes) between the lowest sample in 20-40% of the run and the lowest in
 * 80-100%: the lowest samples, so a GC that happened to run late does not read as growth.
 */
export function growthPerItem(r: SoakResult): number {
  const lowest = (from: number, to: number) => {
    const xs = r.samples.filter((s) => s.n >= from * r.n && s.n <= to * r.n);
    return xs.reduce((a, s) => (s.heapMB < a.heapMB ? s : a));
  };
  const early = lowest(0.2, 0.4);
  const late = lowest(0.8, 1);
  return ((late.heapMB - early.heapMB) * 2 ** 20) / (late.n - early.n);
}

export function printSoak(r: SoakResult, unit: string): void {
  const mb = (x: number) => x.toFixed(1);
  console.log(
    `${r.name}: ${r.n.toLocaleString("en")} ${unit} in ${r.seconds.toFixed(0)} s (${Math.round(r.rate)}/s); heap after GC ${mb(r.samples[0]!.heapMB)} MB at start, growth from 10% to the end ${mb(r.growthMB)} MB (${r.bytesPer.toFixed(1)} B per ${unit.replace(/s$/, "")}, slope ${r.slopeBytesPer.toFixed(1)} B); RSS ${Math.round(r.samples[0]!.rssMB)} -> ${Math.round(r.samples.at(-1)!.rssMB)} MB` +
      (r.payments
        ? `; ${r.payments.created.toLocaleString("en")} answered 201 of ${r.payments.answered.toLocaleString("en")}, ${r.payments.charges.toLocaleString("en")} charges, ${r.payments.rows.toLocaleString("en")} payment rows (${r.payments.distinct.toLocaleString("en")} distinct), ${r.payments.receipts.toLocaleString("en")} receipts`
        : "") +
      (r.check
        ? `; applied ${r.check.distinct.toLocaleString("en")} distinct of ${r.n.toLocaleString("en")}, ${r.check.total - r.check.distinct} twice, ${r.check.outOfOrder} out of order`
        : ""),
  );
}

/** Both parts (SOAK_PART), both brokers (SOAK_BROKERS). */
export async function soakBench(): Promise<SoakResult[]> {
  const part = process.env.SOAK_PART ?? "both";
  const events = Number(process.env.SOAK_EVENTS ?? 1_000_000);
  const payments = Number(process.env.SOAK_PAYMENTS ?? 1_000_000);
  const brokers = (process.env.SOAK_BROKERS ?? "rabbitmq,nats,kafka").split(",");
  const results: SoakResult[] = [];
  if (part !== "service") {
    const kafka = brokers.includes("kafka");
    if (kafka) startBenchBrokers(["kafka"]);
    for (const b of brokers) {
      const make =
        b === "kafka" ? kafkaSoak(benchBrokerUrls().kafka!) : SOAK_BROKERS[b as keyof typeof SOAK_BROKERS];
      const r = await soakMessaging(make, {
        events,
        sampleEvery: Math.max(1_000, Math.round(events / 20)),
        log: console.log,
      });
      printSoak(r, "events");
      results.push(r);
    }
    if (kafka) stopBenchBrokers();
  }
  if (part !== "messaging") {
    const r = await soakService({
      payments,
      sampleEvery: Number(process.env.SOAK_SAMPLE_EVERY ?? Math.max(1_000, Math.round(payments / 20))),
      concurrency: Number(process.env.SOAK_SERVICE_CONCURRENCY ?? 32),
      synchronousCommit: process.env.SOAK_SYNCHRONOUS_COMMIT === "on" ? "on" : "off",
      maxSeconds: process.env.SOAK_SERVICE_SECONDS ? Number(process.env.SOAK_SERVICE_SECONDS) : undefined,
      log: console.log,
    });
    printSoak(r, "payments");
    results.push(r);
  }
  return results;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  soakBench().then(
    () => process.exit(0),
    (err) => {
      console.error(err);
      process.exit(1);
    },
  );
}
