/**
 * The tests `npm run mutate` runs against each mutant: the fast behaviour tests of the mutated modules
 * only (the whole suite would take hours per run). Store tests need DATABASE_URL (the real server).
 */
import { defineConfig } from "vitest/config";

export default defineConfig({
  resolve: { conditions: ["source"] },
  ssr: { resolve: { conditions: ["source"] } },
  test: {
    include: [
      "test/core/**/*.test.ts",
      "test/http/read-once.property.test.ts",
      "test/store/expiry-partitions.test.ts",
      "test/store/speculative.test.ts",
      "test/store/atomic.test.ts",
      "test/store/costs.test.ts",
      "test/store/replay-forms.test.ts",
      "test/store/sealing.test.ts",
      "test/client/answer.test.ts",
      "test/client/backoff.test.ts",
      "test/client/budget.test.ts",
      "test/client/policy-*.test.ts",
      "test/phases/lease.test.ts",
      "test/phases/claims.test.ts",
      "test/phases/answer-bound.test.ts",
      "test/phases/no-idempotency.test.ts",
      "test/phases/expiry-input.test.ts",
      "test/phases/scenarios.test.ts",
      "test/phases/sealing.test.ts",
      "test/phases/runner-rules.test.ts",
      "test/messaging/relay-batches.test.ts",
    ],
    // The store's tests run once per mutant: on the real server (DATABASE_URL), through one driver.
    env: { IDEM_MUTATION_BACKEND: process.env.DATABASE_URL ? "pg" : "pglite" },
    testTimeout: 30_000,
    hookTimeout: 60_000,
  },
});
