/**
 * Kafka and SQS for the messaging tests: where they are (set by .ci/run, which starts them with
 * scripts/kafka.sh and scripts/elasticmq.sh), why a test skips when they are not, and private
 * three-broker Kafka clusters for the fault tests.
 *
 *   IDEM_TEST_KAFKA   bootstrap brokers of a running Kafka (e.g. 127.0.0.1:25000)
 *   IDEM_TEST_SQS     endpoint of a running SQS-compatible server (e.g. http://127.0.0.1:25020)
 *
 * (Not KAFKA_URL / SQS_URL: the reference service reads those, and service processes started by other
 * tests would then share one broker across databases.)
 */
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { it } from "vitest";
import { DATABASE_URL } from "../helpers/db.ts";

const run = promisify(execFile);
const SCRIPT = new URL("../../scripts/kafka.sh", import.meta.url).pathname;

export const KAFKA = process.env.IDEM_TEST_KAFKA;
export const SQS = process.env.IDEM_TEST_SQS;

/**
 * Whether this Node runs the Kafka client idem/messaging/kafka uses: @platformatic/kafka declares
 * Node 22.22+ or 24.6+ (.ci/run runs the Kafka suites on Node 24; `npm test` on Node 20 skips them).
 */
const [major = 0, minor = 0] = process.versions.node.split(".").map(Number);
const KAFKA_CLIENT_RUNS =
  major > 24 || (major === 24 && minor >= 6) || (major === 22 && minor >= 22) || major === 23;

/** Why Kafka tests skip here, or undefined when they can run. */
export const NO_KAFKA = !DATABASE_URL
  ? "needs the real PostgreSQL: set DATABASE_URL"
  : !KAFKA_CLIENT_RUNS
    ? `needs Node 22.22+ or 24.6+ for the Kafka client (@platformatic/kafka); this is ${process.version}`
    : KAFKA
      ? undefined
      : "needs Kafka: set IDEM_TEST_KAFKA (e.g. scripts/kafka.sh start /tmp/kafka prints it)";
export const NO_SQS = !DATABASE_URL
  ? "needs the real PostgreSQL: set DATABASE_URL"
  : SQS
    ? undefined
    : "needs an SQS server: set IDEM_TEST_SQS (e.g. scripts/elasticmq.sh start /tmp/sqs prints it)";

/** A skipped test that says why the file's tests did not run. */
export function sayWhySkipped(reason: string | undefined): void {
  if (reason) it.skip(`skipped: ${reason}`, () => {});
}

/** The SQS client's settings for the local server: any region, dummy credentials. */
export function sqsClientConfig(endpoint = SQS!) {
  return {
    endpoint,
    region: "us-east-1",
    credentials: { accessKeyId: "idem", secretAccessKey: "idem" },
  };
}

/** A private three-broker Kafka cluster (replication factor 3, min.insync.replicas=2). */
export interface KafkaCluster {
  brokers: string;
  dir: string;
  /** Node ids 1-3 and their client ports. */
  ports: Record<number, number>;
  kill(node: number): Promise<void>;
  start(node: number): Promise<void>;
  stop(): Promise<void>;
}

/**
 * Start a three-broker cluster through scripts/kafka.sh on `portBase`..`portBase + 5` (default
 * IDEM_TEST_KAFKA_CLUSTER_PORT or 25010), data in a temporary directory removed by `stop()`.
 */
export async function startKafkaCluster(portBase?: number): Promise<KafkaCluster> {
  const base = portBase ?? Number(process.env.IDEM_TEST_KAFKA_CLUSTER_PORT ?? 25010);
  const dir = mkdtempSync(join(tmpdir(), "idem-kafka-cluster-"));
  const sh = (...args: string[]) => run("bash", [SCRIPT, ...args], { timeout: 180_000 });
  try {
    const { stdout } = await sh("cluster", dir, String(base));
    return {
      brokers: stdout.trim().split("\n").at(-1)!,
      dir,
      ports: { 1: base, 2: base + 2, 3: base + 4 },
      kill: async (n) => void (await sh("node-kill", dir, String(n))),
      start: async (n) => void (await sh("node-start", dir, String(n))),
      async stop() {
        await sh("stop", dir).catch(() => {});
        rmSync(dir, { recursive: true, force: true });
      },
    };
  } catch (err) {
    await sh("stop", dir).catch(() => {});
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
}
