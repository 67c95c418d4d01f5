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
    // The MCP SDK's HTTP client imports eventsource-parser, whose `source` condition (the one idem's
    // tests resolve with, and pass to Node) points at TypeScript that Node will not load from
    // node_modules: those modules go through Vite, which compiles it.
    server: {
      deps: {
        inline: [
          /@modelcontextprotocol\/sdk\/dist\/esm\/client\/(sse|streamableHttp)\.js/,
          "eventsource-parser",
        ],
      },
    },
    // At least two files at a time. Vitest's default (one fewer than the cores) runs one file at a time
    // on a 2-core machine, while most files spend their time waiting on PostgreSQL, the brokers, child
    // processes and private clusters. Every file owns its databases, ports and queues, so they may
    // overlap: on 2 cores the whole suite took 487 s with two, 987 s with one (2 Dec 2026).
    maxWorkers: Math.max(2, availableParallelism() - 1),
  },
});
