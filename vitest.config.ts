import { availableParallelism } from "node:os";
import { defineConfig } from "vitest/config";

export default defineConfig({
  resolve: { conditions: ["source"] },
  ssr: { resolve: { conditions: ["source"] } },
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
    // At least two files at a time. Vitest's default (one fewer than the cores) runs one file at a time
    // on a 2-core machine, while most files spend their time waiting on PostgreSQL, the brokers, child
    // processes and private clusters. Every file owns its databases, ports and queues, so they may
    // overlap: on 2 cores the whole suite took 487 s with two, 987 s with one (2 Dec 2026).
    maxWorkers: Math.max(2, availableParallelism() - 1),
  },
});
