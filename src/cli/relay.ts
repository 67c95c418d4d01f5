import { redactUrl } from "../core/redact.ts";
import type { Publisher } from "../messaging/types.ts";
import { pendingMigrations } from "../postgres/schema/migrate.ts";
import { CliError, EXIT, openDb, parse } from "./shared.ts";

const USAGE = `usage: idem relay [--amqp URL | --nats URL | --kafka URL | --sqs URL | --webhook URL] [options]

Publishes the outbox's events, at least once, with the event id as the message id; runs until SIGINT
or SIGTERM (or, with --once, until nothing is left to publish now). Several relays may run at once.
  --amqp URL           RabbitMQ (default: $AMQP_URL); the topic is the routing key
  --exchange NAME      the AMQP exchange (default: "", so the topic names the queue)
  --nats URL           NATS JetStream (default: $NATS_URL); the topic is the subject
  --kafka URL          Kafka brokers, kafka://host:port[,host:port] (default: $KAFKA_URL); the topic
                       is the Kafka topic, the aggregate id the record key
  --sqs URL            the SQS endpoint, e.g. https://sqs.eu-west-1.amazonaws.com (default: $SQS_URL;
                       region and credentials from the AWS environment); the topic names the queue
  --webhook URL        POST each event, signed with $WEBHOOK_SECRET (default: $WEBHOOK_URL)
  --database-url URL   default: $DATABASE_URL, else the embedded PGlite in .idem/pgdata
  --listen-database-url URL
                       straight to PostgreSQL, for LISTEN when DATABASE_URL goes through a pooler
                       (default: $IDEM_LISTEN_DATABASE_URL; without one, a pooler means polling every 0.5 s)
  --schema NAME        default: idem
  --topic T            only this topic (repeat for several); default: every topic
  --batch-size N       rows claimed per batch (default 500)
  --concurrency N      batches in flight (default 1)
  --ordered            publish each aggregate's events in the order written
  --pipeline           with --ordered: send a batch in one go, not one confirm per event (AMQP, NATS,
                       Kafka)
  --max-attempts N     failures before a row is parked (default 10)
  --retention-hours H  delete published rows after H hours, 0 keeps them (default 24)
  --once               publish what is pending now, then exit
  --requeue-parked     put parked rows back in the queue (with --topic: only those), then exit
When only one of AMQP_URL, NATS_URL, KAFKA_URL, SQS_URL and WEBHOOK_URL is set, that is the broker.
Exit codes: 0 done or stopped cleanly, 1 failure (e.g. broker unreachable with --once), 2 bad usage.`;

function int(value: string | undefined, name: string, fallback: number, min: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n < min)
    throw new CliError(`${name} takes a whole number >= ${min}`, EXIT.usage);
  return n;
}

const KINDS = ["amqp", "nats", "kafka", "sqs", "webhook"] as const;
type Kind = (typeof KINDS)[number];
type BrokerFlags = Partial<Record<Kind, string>>;

/** Which broker: the flag given, else the only one of AMQP_URL, NATS_URL, ... WEBHOOK_URL that is set. */
function brokerKind(values: BrokerFlags): Kind {
  const flags = KINDS.filter((k) => values[k]);
  const list = (names: string[], glue: string) => names.join(", ").replace(/, ([^,]*)$/, ` ${glue} $1`);
  const flagNames = KINDS.map((k) => `--${k}`);
  if (flags.length > 1) throw new CliError(`give one of ${list(flagNames, "and")}`, EXIT.usage);
  let kind = flags[0];
  if (!kind) {
    const set = KINDS.filter((k) => process.env[`${k.toUpperCase()}_URL`]);
    if (set.length === 0) {
      throw new CliError(
        `no broker: set ${list(
          KINDS.map((k) => `${k.toUpperCase()}_URL`),
          "or",
        )}, or pass ${list(flagNames, "or")}`,
        EXIT.usage,
      );
    }
    if (set.length > 1) {
      throw new CliError(
        `${set.map((k) => `${k.toUpperCase()}_URL`).join(" and ")} are all set: choose with --${set[0]} (or another)`,
        EXIT.usage,
      );
    }
    kind = set[0]!;
  }
  if (kind === "webhook" && !process.env.WEBHOOK_SECRET) {
    throw new CliError(
      "webhooks are signed: set WEBHOOK_SECRET (e.g. whsec_ followed by base64)",
      EXIT.usage,
    );
  }
  return kind;
}

async function makePublisher(
  kind: Kind,
  values: BrokerFlags & { exchange?: string },
): Promise<{ publisher: Publisher; where: string }> {
  const url = values[kind] ?? process.env[`${kind.toUpperCase()}_URL`]!;
  if (kind === "amqp") {
    const { AmqpPublisher } = await import("../messaging/amqp.ts");
    return {
      publisher: new AmqpPublisher({ url, exchange: values.exchange ?? "" }),
      where: `RabbitMQ ${redactUrl(url)}`,
    };
  }
  if (kind === "nats") {
    const { NatsPublisher } = await import("../messaging/nats.ts");
    return { publisher: new NatsPublisher({ servers: url.split(",") }), where: `NATS ${url}` };
  }
  if (kind === "kafka") {
    const { KafkaPublisher, kafkaBrokers } = await import("../messaging/kafka.ts");
    return { publisher: new KafkaPublisher({ brokers: url }), where: `Kafka ${kafkaBrokers(url).join(",")}` };
  }
  if (kind === "sqs") {
    const { SqsPublisher } = await import("../messaging/sqs.ts");
    return { publisher: new SqsPublisher({ endpoint: url }), where: `SQS ${redactUrl(url)}` };
  }
  const secret = process.env.WEBHOOK_SECRET;
  if (!secret)
    throw new CliError(
      "webhooks are signed: set WEBHOOK_SECRET (e.g. whsec_ followed by base64)",
      EXIT.usage,
    );
  const { WebhookPublisher } = await import("../messaging/webhook.ts");
  return { publisher: new WebhookPublisher({ url, secret }), where: `webhooks to ${url}` };
}

export async function relayCommand(argv: string[]): Promise<number> {
  const { values } = parse(
    argv,
    {
      amqp: { type: "string" },
      exchange: { type: "string" },
      nats: { type: "string" },
      kafka: { type: "string" },
      sqs: { type: "string" },
      webhook: { type: "string" },
      "database-url": { type: "string" },
      "listen-database-url": { type: "string" },
      schema: { type: "string" },
      topic: { type: "string", multiple: true },
      "batch-size": { type: "string" },
      concurrency: { type: "string" },
      ordered: { type: "boolean" },
      pipeline: { type: "boolean" },
      "max-attempts": { type: "string" },
      "retention-hours": { type: "string" },
      once: { type: "boolean" },
      "requeue-parked": { type: "boolean" },
    },
    USAGE,
  );
  if (values.help) {
    console.log(USAGE);
    return EXIT.ok;
  }
  const batchSize = int(values["batch-size"], "--batch-size", 500, 1);
  const concurrency = int(values.concurrency, "--concurrency", 1, 1);
  const maxAttempts = int(values["max-attempts"], "--max-attempts", 10, 1);
  const retentionHours = Number(values["retention-hours"] ?? 24);
  if (!(retentionHours >= 0)) throw new CliError("--retention-hours takes a number >= 0", EXIT.usage);
  const schema = values.schema ?? "idem";
  const dbUrl = values["database-url"] ?? process.env.DATABASE_URL;
  const kind = values["requeue-parked"] ? undefined : brokerKind(values);
  if (values.pipeline && (!values.ordered || kind === "webhook" || kind === "sqs")) {
    throw new CliError("--pipeline goes with --ordered, to RabbitMQ, NATS or Kafka", EXIT.usage);
  }
  const { Relay, requeueParked, outboxCounts } = await import("../messaging/relay.ts");

  const listenUrl = values["listen-database-url"] ?? (process.env.IDEM_LISTEN_DATABASE_URL || undefined);
  const { db, where, listen } = await openDb(dbUrl, {
    listenUrl,
    onListenError: (e) => console.error(`idem relay: LISTEN connection: ${e.message} (polling meanwhile)`),
  });
  try {
    const pending = await pendingMigrations(db, { schema });
    if (pending.some((m) => Number.parseInt(m, 10) <= 3)) {
      throw new CliError(
        `the outbox on ${where} is not migrated (${pending.join(", ")} pending): run idem migrate`,
      );
    }
    if (values["requeue-parked"]) {
      const n = await requeueParked(db, {
        schema,
        ...(values.topic?.length === 1 ? { topic: values.topic[0] } : {}),
      });
      console.log(`requeued ${n} parked event(s) on ${where}`);
      return EXIT.ok;
    }
    const { publisher, where: to } = await makePublisher(kind!, values);
    const relay = new Relay({
      db,
      publisher,
      schema,
      batchSize,
      concurrency,
      maxAttempts,
      orderByAggregate: values.ordered ?? false,
      pipeline: values.pipeline ?? false,
      retentionMs: retentionHours * 3_600_000,
      ...(values.topic ? { topics: values.topic } : {}),
      listen: values.once ? undefined : listen,
      onError: (e) => console.error(`idem relay: ${e.message}`),
    });
    try {
      if (values.once) {
        // Until a batch comes back short: what is left is in backoff, parked or locked by another relay.
        for (;;) {
          const claimed = await relay.runOnce();
          if (relay.stats.unavailable > 0) {
            throw new CliError(`cannot reach ${to}: start the broker or fix its URL`);
          }
          if (claimed < batchSize) break;
        }
        const counts = await outboxCounts(db, { schema });
        console.log(
          `published ${relay.stats.published} event(s) to ${to}; ${relay.stats.failed} failed, ${counts.pending} pending, ${counts.parked} parked`,
        );
        return relay.stats.failed > 0 ? EXIT.failure : EXIT.ok;
      }
      await relay.start();
      console.log(`idem relay: publishing the outbox of ${where} to ${to} (stop with Ctrl-C)`);
      await new Promise<void>((resolve) => {
        for (const sig of ["SIGINT", "SIGTERM"] as const) process.once(sig, () => resolve());
      });
      await relay.stop();
      console.log(`idem relay: stopped after publishing ${relay.stats.published} event(s)`);
      return EXIT.ok;
    } finally {
      await publisher.close();
    }
  } finally {
    await db.close();
  }
}
