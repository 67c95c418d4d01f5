/** examples/kafka-sqs.ts runs against the test brokers and prints one receipt per event and broker. */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { freshDatabase } from "../helpers/db.ts";
import { KAFKA, NO_KAFKA, NO_SQS, SQS, sayWhySkipped } from "./brokers.ts";

const run = promisify(execFile);
sayWhySkipped(NO_KAFKA ?? NO_SQS);

describe.skipIf(NO_KAFKA !== undefined || NO_SQS !== undefined)("examples/kafka-sqs.ts", () => {
  it("applies each event once: Kafka's copies dropped by the inbox, SQS FIFO's by the queue", async () => {
    const fresh = await freshDatabase("idem_example");
    try {
      const { stdout } = await run(
        "node_modules/.bin/tsx",
        ["--conditions=source", "examples/kafka-sqs.ts"],
        {
          timeout: 120_000,
          env: {
            ...process.env,
            DATABASE_URL: fresh.url,
            KAFKA_URL: `kafka://${KAFKA}`,
            SQS_URL: SQS,
            AWS_REGION: "us-east-1",
            AWS_ACCESS_KEY_ID: "idem",
            AWS_SECRET_ACCESS_KEY: "idem",
          },
        },
      );
      expect(stdout).toContain("kafka: applied 3, duplicates 3");
      expect(stdout).toContain("sqs: applied 3, duplicates 0");
      expect(stdout).toContain("receipts: 6");
    } finally {
      await fresh.drop();
    }
  });
});
